package k8s

import (
	"testing"

	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
	"github.com/coordino/coordino/daemon/identity"
)

func TestTemporaryThenClusterIdentity(t *testing.T) {
	nsLabels := map[string]map[string]string{"team-a": {"team": "a"}}
	a := NewIdentities(func(ns string) (map[string]string, bool) { l, ok := nsLabels[ns]; return l, ok })
	pod := map[string]string{"app": "web"}

	tmp, created, err := a.Acquire("team-a", pod)
	if err != nil || !created || tmp.ID < identity.FirstNodeLocal || tmp.ID > identity.LastNodeLocal {
		t.Fatalf("Acquire without a cluster Identity = %+v, %v, %v; want a new temporary identity", tmp, created, err)
	}
	if a.Stale("team-a", pod) || a.Temporary() != 1 {
		t.Fatal("temporary identity stale before any cluster Identity exists")
	}
	// The controller creates the Identity: same label set, as it forms it.
	full := coordinov1alpha1.SecurityLabels(pod, nsLabels["team-a"], nil)
	obj := &coordinov1alpha1.Identity{Spec: coordinov1alpha1.IdentitySpec{Namespace: "team-a", Labels: full}}
	obj.Name = "4711"
	cid, hash, err := clusterIdentity(obj)
	if err != nil {
		t.Fatal(err)
	}
	a.SetCluster(cid, hash)
	if !a.Stale("team-a", pod) {
		t.Fatal("endpoint on a temporary identity not stale once the cluster Identity exists")
	}
	// The datapath re-attaches: acquire the new one, release the old one.
	got, _, err := a.Acquire("team-a", pod)
	if err != nil || got.ID != 4711 {
		t.Fatalf("Acquire with a cluster Identity = %+v, %v; want 4711", got, err)
	}
	if !a.Release(tmp.ID) || a.Stale("team-a", pod) || a.Temporary() != 0 {
		t.Fatal("temporary identity not gone after the move")
	}
	// A namespace label change makes it a different label set: no longer
	// this cluster identity (the controller will create another).
	nsLabels["team-a"] = map[string]string{"team": "b"}
	if !a.Stale("team-a", pod) {
		t.Fatal("cluster identity of a changed label set not stale")
	}
	if next, _, _ := a.Acquire("team-a", pod); next.ID == 4711 {
		t.Fatal("changed label set kept the old cluster identity")
	}
}

func TestIdentitiesRestoreKeepsPinnedNumbers(t *testing.T) {
	a := NewIdentities(func(string) (map[string]string, bool) { return nil, false })
	for _, id := range []identity.Identity{
		{ID: 4711, Namespace: "ns", Labels: map[string]string{"a": "1"}},
		{ID: identity.FirstNodeLocal + 3, Namespace: "ns", Labels: map[string]string{"a": "2"}},
	} {
		if err := a.Restore(id); err != nil {
			t.Fatal(err)
		}
	}
	// A new temporary label set must not take the restored number.
	n, _, _ := a.Acquire("ns", map[string]string{"a": "3"})
	if n.ID == identity.FirstNodeLocal+3 {
		t.Fatal("restored temporary number handed out again")
	}
	if !a.Release(4711) || a.Release(4711) {
		t.Fatal("restored cluster identity reference counting wrong")
	}
}

// An ADD that took a temporary identity just before its label set's
// cluster Identity appeared is re-checked once it completes: the refresh
// the Identity triggered may have listed the stored endpoints before this
// one's record was there.
func TestAttachedRechecksTemporaryIdentity(t *testing.T) {
	nsLabels := map[string]string{"kubernetes.io/metadata.name": "default"}
	s := &Source{
		ids:  NewIdentities(func(string) (map[string]string, bool) { return nsLabels, true }),
		kick: make(chan struct{}, 1),
	}
	pod := map[string]string{"role": "client"}
	if _, _, err := s.ids.Acquire("default", pod); err != nil {
		t.Fatal(err)
	}
	s.Attached("default", pod)
	if s.dirty.identities || len(s.kick) != 0 {
		t.Fatal("no cluster Identity yet, but the endpoint was marked for a move")
	}
	obj := &coordinov1alpha1.Identity{Spec: coordinov1alpha1.IdentitySpec{Namespace: "default", Labels: coordinov1alpha1.SecurityLabels(pod, nsLabels, nil)}}
	obj.Name = "300"
	cid, hash, err := clusterIdentity(obj)
	if err != nil {
		t.Fatal(err)
	}
	s.ids.SetCluster(cid, hash)
	s.Attached("default", pod)
	if !s.dirty.identities || len(s.kick) != 1 {
		t.Fatal("an endpoint left on a temporary identity after its cluster Identity appeared is not moved")
	}
}
