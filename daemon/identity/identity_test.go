package identity

import (
	"net/netip"
	"testing"
)

func TestAcquireSameLabelSetSameIdentity(t *testing.T) {
	a := NewAllocator()
	x, created, err := a.Acquire("ns1", map[string]string{"app": "web", "tier": "fe"})
	if err != nil || !created || x.ID != FirstPod {
		t.Fatalf("first acquire = %v %v %v, want new identity %d", x.ID, created, err, FirstPod)
	}
	y, created, _ := a.Acquire("ns1", map[string]string{"tier": "fe", "app": "web"})
	if created || y.ID != x.ID {
		t.Fatalf("same label set got %d (created=%v), want %d", y.ID, created, x.ID)
	}
	z, _, _ := a.Acquire("ns2", map[string]string{"app": "web", "tier": "fe"})
	if z.ID == x.ID {
		t.Fatalf("other namespace shares identity %d", z.ID)
	}
	if a.Release(x.ID) {
		t.Fatal("identity released while a reference remains")
	}
	if !a.Release(x.ID) {
		t.Fatal("identity not released after the last reference")
	}
	if _, ok := a.Get(x.ID); ok {
		t.Fatal("released identity still present")
	}
}

func TestRestoreKeepsNumbers(t *testing.T) {
	a := NewAllocator()
	if err := a.Restore(Identity{ID: 300, Namespace: "ns", Labels: map[string]string{"a": "b"}}); err != nil {
		t.Fatal(err)
	}
	got, created, _ := a.Acquire("ns", map[string]string{"a": "b"})
	if created || got.ID != 300 {
		t.Fatalf("acquire after restore = %d created=%v, want 300", got.ID, created)
	}
	if err := a.Restore(Identity{ID: 300, Namespace: "other"}); err == nil {
		t.Fatal("restoring a used number for another label set succeeded")
	}
	if err := a.Restore(Identity{ID: Host}); err == nil {
		t.Fatal("restoring a reserved identity succeeded")
	}
	// New allocations skip restored numbers.
	a2 := NewAllocator()
	_ = a2.Restore(Identity{ID: FirstPod, Namespace: "x"})
	n, _, _ := a2.Acquire("y", nil)
	if n.ID == FirstPod {
		t.Fatal("allocation reused a restored identity")
	}
}

func TestCIDRIdentities(t *testing.T) {
	c := NewCIDRs()
	p := netip.MustParsePrefix("10.0.0.0/8")
	id, err := c.Get(netip.MustParsePrefix("10.1.2.3/8"))
	if err != nil || !id.IsCIDR() {
		t.Fatalf("Get = %v, %v", id, err)
	}
	if again, _ := c.Get(p); again != id {
		t.Fatalf("same prefix got %d then %d", id, again)
	}
	c.Retain(map[netip.Prefix]bool{})
	if err := c.Restore(p, id); err != nil {
		t.Fatal(err)
	}
	if err := c.Restore(netip.MustParsePrefix("11.0.0.0/8"), id); err == nil {
		t.Fatal("restore of a used number for another prefix succeeded")
	}
	if Host.String() != "host" || World.String() != "world" || ID(300).String() != "300" {
		t.Fatal("unexpected identity names")
	}
}

func TestRangeAllocatorStaysInRange(t *testing.T) {
	a := NewRangeAllocator(FirstNodeLocal, FirstNodeLocal+1)
	x, _, _ := a.Acquire("ns", map[string]string{"a": "1"})
	y, _, _ := a.Acquire("ns", map[string]string{"a": "2"})
	if x.ID != FirstNodeLocal || y.ID != FirstNodeLocal+1 {
		t.Fatalf("got %d, %d", x.ID, y.ID)
	}
	if _, _, err := a.Acquire("ns", map[string]string{"a": "3"}); err == nil {
		t.Fatal("allocation past the range succeeded")
	}
	if err := a.Restore(Identity{ID: 300, Namespace: "ns"}); err == nil {
		t.Fatal("restore outside the range succeeded")
	}
	var _ Assigner = a
}
