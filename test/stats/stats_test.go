package stats

import (
	"slices"
	"testing"
)

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want float64
	}{
		{nil, 0},
		{[]float64{3}, 3},
		{[]float64{5, 1, 3}, 3},
		{[]float64{4, 1, 3, 2}, 2.5},
		{[]float64{0.7, 0.6, 0.9, 0.5, 0.8, 0.65, 0.75}, 0.7},
	} {
		in := slices.Clone(c.in)
		if got := Median(in); got != c.want {
			t.Errorf("Median(%v) = %v, want %v", c.in, got, c.want)
		}
		if !slices.Equal(in, c.in) {
			t.Errorf("Median reordered its input: %v, was %v", in, c.in)
		}
	}
}

func TestRange(t *testing.T) {
	if lo, hi := Range(nil); lo != 0 || hi != 0 {
		t.Errorf("Range(nil) = %v, %v", lo, hi)
	}
	if lo, hi := Range([]float64{0.8, 0.61, 0.74}); lo != 0.61 || hi != 0.8 {
		t.Errorf("Range = %v, %v, want 0.61, 0.8", lo, hi)
	}
}
