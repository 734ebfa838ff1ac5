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
