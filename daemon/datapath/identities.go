package datapath

import (
	"fmt"

	"github.com/coordino/coordino/daemon/identity"
)

// Identity seam. Policy peers resolve against every known identity: those
// of local endpoints (from Config.Identities at attach) and those an
// identity source announces here. Standalone, nothing calls these (all pods
// are local). In Kubernetes mode the daemon's Identity informer calls
// UpsertIdentity for every cluster Identity (numbers in
// [identity.FirstPod, identity.LastCluster]) and for temporary node-local
// ones of other nodes if it learns of them, and DeleteIdentity when one
// goes. Both cost work proportional to the policy rules that select the
// identity as a peer, and write only the resulting map differences.

// UpsertIdentity makes id known as a possible policy peer (or replaces its
// labels). Calling it again with the same labels is cheap and harmless.
func (d *Datapath) UpsertIdentity(id identity.Identity) error {
	if id.ID < identity.FirstPod || id.ID.IsCIDR() {
		return fmt.Errorf("datapath: upsert identity %d: not a pod identity", id.ID)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.engine.UpsertIdentity(id)
	return d.flush("apply identity change")
}

// DeleteIdentity forgets an identity announced by UpsertIdentity. Local
// endpoints holding it keep it until they detach.
func (d *Datapath) DeleteIdentity(id identity.ID) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.engine.DeleteIdentity(id)
	return d.flush("apply identity change")
}
