package store

import (
	"errors"
	"net/netip"
	"testing"
	"time"
)

func TestPutGetListDeleteSurvivesReopen(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	a := &Endpoint{Key: Key{"net1", "c1", "eth0"}, Mode: ModePrimary, IPs: []netip.Prefix{netip.MustParsePrefix("10.1.0.2/32")}, Created: time.Now()}
	b := &Endpoint{Key: Key{"net2", "c2", "eth0"}, Mode: ModeChained}
	for _, ep := range []*Endpoint{a, b} {
		if err := s.Put(ep); err != nil {
			t.Fatal(err)
		}
	}
	s.Close()

	s, err = Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got, err := s.Get(a.Key)
	if err != nil || got.Mode != ModePrimary || len(got.IPs) != 1 || got.IPs[0] != a.IPs[0] {
		t.Fatalf("Get after reopen = %+v, %v", got, err)
	}
	if l, _ := s.List("net2"); len(l) != 1 || l[0].ContainerID != "c2" {
		t.Fatalf("List(net2) = %+v", l)
	}
	if l, _ := s.List(""); len(l) != 2 {
		t.Fatalf("List() = %d records", len(l))
	}
	if err := s.Delete(a.Key); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(a.Key); err != nil {
		t.Fatalf("second delete: %v", err)
	}
	if _, err := s.Get(a.Key); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get after delete err = %v", err)
	}
}

func TestGenerationGrowsAcrossDeleteAndReopen(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	k := Key{"net1", "c1", "eth0"}
	first := &Endpoint{Key: k}
	if err := s.Put(first); err != nil || first.Generation == 0 {
		t.Fatalf("first Put: gen %d, %v", first.Generation, err)
	}
	// Rewriting a record keeps its generation.
	if err := s.Put(first); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Get(k); got.Generation != first.Generation {
		t.Fatalf("rewrite changed generation %d → %d", first.Generation, got.Generation)
	}
	if err := s.Delete(k); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if s, err = Open(dir); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	second := &Endpoint{Key: k}
	if err := s.Put(second); err != nil || second.Generation <= first.Generation {
		t.Fatalf("re-ADD after reopen: gen %d after %d, %v", second.Generation, first.Generation, err)
	}
}
