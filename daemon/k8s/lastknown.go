package k8s

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"

	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
	"github.com/coordino/coordino/daemon/atomicfile"
	"github.com/coordino/coordino/daemon/policy"
	"github.com/coordino/coordino/internal/schema"
	cnpv1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
)

// lastKnownFile is the file in the state directory holding lastKnown.
const lastKnownFile = "k8s-last-known.json"

// LastKnownFormat is the last-known state file's layout. Version 1
// (unstamped) is that of the releases before stamps; version 2 adds the
// stamp, which version 1 ignores. The file is a cache of the API server:
// a daemon that refuses one too new serves without it through an outage,
// and replaces it with its own once it has the cluster's state.
var LastKnownFormat = schema.Format{What: "last-known cluster state", Current: 2, MinReader: 1}

// lastKnown is the cluster state the daemon last saw from the API server:
// what a daemon restarted during an API outage serves from, so it keeps
// the node's blocks, pod labels, identities and policy instead of starting
// empty (which would flush policy and stop ADDs).
type lastKnown struct {
	Schema     schema.Stamp                 `json:"schema"`
	Saved      time.Time                    `json:"saved"`
	Blocks     []coordinov1alpha1.NodeBlock `json:"blocks,omitempty"`
	Generation int64                        `json:"generation,omitempty"`
	Pods       map[string]knownPod          `json:"pods,omitempty"` // namespace/name
	Namespaces map[string]map[string]string `json:"namespaces,omitempty"`
	// Policies is what daemons saved before they read PolicyIRs; still
	// served from when a file has it.
	Policies  []*networkingv1.NetworkPolicy `json:"policies,omitempty"`
	PolicyIRs []*coordinov1alpha1.PolicyIR  `json:"policyIRs,omitempty"`
	// ClusterPolicies are the ClusterNetworkPolicies (added in place: an
	// older daemon ignores the field, a newer one reads none from an older file).
	ClusterPolicies []*cnpv1beta1.ClusterNetworkPolicy `json:"clusterNetworkPolicies,omitempty"`
	// NodeIsolation keeps node isolation in force through an API outage.
	NodeIsolation []*coordinov1alpha1.NodeIsolationPolicy `json:"nodeIsolation,omitempty"`
	// Nodes keep nodes peers in force: names, labels and addresses only.
	Nodes      []*corev1.Node                           `json:"nodes,omitempty"`
	Identities map[string]coordinov1alpha1.IdentitySpec `json:"identities,omitempty"` // name (number) → spec
}

type knownPod struct {
	UID        string             `json:"uid,omitempty"`
	Labels     map[string]string  `json:"labels,omitempty"`
	NamedPorts []policy.NamedPort `json:"namedPorts,omitempty"`
}

// loadLastKnown reads the state saved by a previous run; nil when none.
func loadLastKnown(dir string) (*lastKnown, error) {
	// A daemon killed while saving left its temporary file: this run is
	// the file's one writer, and has not written yet.
	if err := atomicfile.RemoveTemps(filepath.Join(dir, lastKnownFile)); err != nil {
		return nil, fmt.Errorf("remove temporary files of the last-known cluster state: %w", err)
	}
	data, err := os.ReadFile(filepath.Join(dir, lastKnownFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read last-known cluster state: %w", err)
	}
	path := filepath.Join(dir, lastKnownFile)
	var lk lastKnown
	if err := json.Unmarshal(data, &lk); err != nil {
		return nil, fmt.Errorf("decode last-known cluster state %s: %w", path, err)
	}
	// Versions 1 and 2 hold the same fields: nothing to migrate.
	if _, err := LastKnownFormat.Check(path, lk.Schema); err != nil {
		return nil, err
	}
	return &lk, nil
}

// save writes lk atomically: a crash leaves the previous state or this one.
func (lk *lastKnown) save(dir string) error {
	lk.Schema = LastKnownFormat.Stamp()
	data, err := json.Marshal(lk)
	if err != nil {
		return fmt.Errorf("encode last-known cluster state: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if err := atomicfile.Write(filepath.Join(dir, lastKnownFile), data, 0o600); err != nil {
		return fmt.Errorf("save last-known cluster state: %w", err)
	}
	return nil
}
