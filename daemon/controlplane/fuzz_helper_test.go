package controlplane

import (
	"testing"

	"github.com/coordino/coordino/daemon/identity"
	"github.com/coordino/coordino/daemon/policy"
)

func compileForFuzz(t *testing.T, objs *Objects) {
	alloc := identity.NewAllocator()
	var in policy.Input
	in.Policies, in.Namespaces, in.ClusterPolicies, in.Nodes = objs.Policies, objs.Namespaces, objs.ClusterPolicies, objs.Nodes
	for _, labels := range []map[string]string{{"app": "web"}, {"a": "b"}, nil} {
		id, _, _ := alloc.Acquire("default", labels)
		in.Identities = append(in.Identities, id)
		in.Local = append(in.Local, id.ID)
	}
	res, err := policy.Compile(in, identity.NewCIDRs())
	if err != nil {
		t.Fatalf("parsed objects failed to compile: %v", err)
	}
	for _, r := range res.Rules {
		if len(r.Keys()) == 0 {
			t.Fatalf("rule %v expands to no keys", r)
		}
	}
}
