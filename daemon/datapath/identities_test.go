package datapath

import (
	"testing"

	"github.com/coordino/coordino/daemon/identity"
	"github.com/coordino/coordino/daemon/policy"
)

// An identity announced by an identity source (another node's pod) becomes
// a peer of the local policies that select it, and stops being one when it
// is deleted.
func TestAnnouncedIdentityIsPolicyPeer(t *testing.T) {
	c := newCluster(t, AttachTC)
	c.policies(serverIngress)
	remote := identity.Identity{ID: identity.FirstNodeLocal + 7, Namespace: "default", Labels: map[string]string{"app": "client"}}
	hasPeer := func() bool {
		c.dp.mu.Lock()
		defer c.dp.mu.Unlock()
		for k := range c.dp.mw.mirror.policy {
			if k.Remote == remote.ID && k.Dir == policy.Ingress {
				return true
			}
		}
		return false
	}
	if hasPeer() {
		t.Fatal("policy entry for an unknown identity")
	}
	if err := c.dp.UpsertIdentity(remote); err != nil {
		t.Fatal(err)
	}
	if !hasPeer() {
		t.Fatal("announced identity is not a peer of server-ingress")
	}
	if err := c.dp.DeleteIdentity(remote.ID); err != nil {
		t.Fatal(err)
	}
	if hasPeer() {
		t.Fatal("deleted identity still a peer")
	}
}
