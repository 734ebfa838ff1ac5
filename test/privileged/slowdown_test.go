package privileged

import (
	"testing"
	"time"
)

func TestSlowdown(t *testing.T) {
	for _, c := range []struct {
		env  string
		want time.Duration
	}{{"", time.Second}, {"10", 10 * time.Second}, {"0", time.Second}, {"-3", time.Second}, {"x", time.Second}} {
		t.Setenv(SlowdownEnv, c.env)
		if got := Slowdown(time.Second); got != c.want {
			t.Errorf("%s=%q: Slowdown(1s) = %s, want %s", SlowdownEnv, c.env, got, c.want)
		}
	}
}
