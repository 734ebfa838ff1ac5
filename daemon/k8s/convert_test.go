package k8s

import (
	"net/netip"
	"strings"
	"testing"

	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
	"github.com/coordino/coordino/daemon/identity"
	"github.com/coordino/coordino/daemon/ipam"
)

func TestBlockSpecsSkipsInvalid(t *testing.T) {
	got, err := blockSpecs([]coordinov1alpha1.NodeBlock{
		{CIDR: "10.0.0.0/26", Pool: "p"}, {CIDR: "10.0.0.1/26"}, {CIDR: "nonsense"}, {CIDR: "fd00::/122", Releasing: true},
	})
	if err == nil || !strings.Contains(err.Error(), "spec.blocks[1]") || !strings.Contains(err.Error(), "spec.blocks[2]") {
		t.Fatalf("err = %v, want both bad entries named", err)
	}
	if len(got) != 2 || got[1].Prefix != netip.MustParsePrefix("fd00::/122") || !got[1].Releasing {
		t.Fatalf("blocks = %+v", got)
	}
}

// FuzzNodeConfigBlocks: any spec.blocks content converts without panicking,
// yields only canonical prefixes, and the pool accepts the result.
func FuzzNodeConfigBlocks(f *testing.F) {
	f.Add("10.0.0.0/26", "fd00::/122", false)
	f.Add("10.0.0.1/26", "", true)
	f.Add("::ffff:10.0.0.0/120", "0.0.0.0/0", false)
	f.Add("10.0.0.0/32", "10.0.0.0/8", true)
	f.Fuzz(func(t *testing.T, a, b string, releasing bool) {
		specs, _ := blockSpecs([]coordinov1alpha1.NodeBlock{{CIDR: a}, {CIDR: b, Releasing: releasing}})
		for _, s := range specs {
			if !s.Prefix.IsValid() || s.Prefix != s.Prefix.Masked() {
				t.Fatalf("non-canonical block %v from %q/%q", s.Prefix, a, b)
			}
		}
		p, _ := ipam.NewPool(nil)
		_ = p.SetBlocks(specs)
		for _, u := range p.Usage() {
			if u.Size <= 0 || u.Used != 0 {
				t.Fatalf("bad usage %+v", u)
			}
		}
	})
}

func TestClusterIdentityValidation(t *testing.T) {
	for name, want := range map[string]bool{"256": true, "8388607": true, "255": false, "8388608": false, "0256": false, "x": false, "": false} {
		obj := &coordinov1alpha1.Identity{Spec: coordinov1alpha1.IdentitySpec{Namespace: "ns"}}
		obj.Name = name
		if _, _, err := clusterIdentity(obj); (err == nil) != want {
			t.Errorf("clusterIdentity(%q) err = %v, want ok=%v", name, err, want)
		}
	}
}

// FuzzIdentityLabelSet: any Identity converts without panicking; a valid
// one keeps the pod labels, drops the namespace ones, and its hash is the
// one the controller stores for the same label set.
func FuzzIdentityLabelSet(f *testing.F) {
	f.Add("4711", "team-a", "app", "web", "coordino.io/ns.team", "a")
	f.Add("256", "", "", "", "", "")
	f.Add("99999999", "ns", "coordino.io/ns.", "x", "k", "v")
	f.Fuzz(func(t *testing.T, name, ns, k1, v1, k2, v2 string) {
		obj := &coordinov1alpha1.Identity{Spec: coordinov1alpha1.IdentitySpec{Namespace: ns, Labels: map[string]string{k1: v1, k2: v2}}}
		obj.Name = name
		id, hash, err := clusterIdentity(obj)
		if err != nil {
			return
		}
		if id.ID < identity.FirstPod || id.ID > identity.LastCluster || id.Namespace != ns {
			t.Fatalf("identity %+v from %q", id, name)
		}
		for k, v := range obj.Spec.Labels {
			_, kept := id.Labels[k]
			if strings.HasPrefix(k, coordinov1alpha1.NamespaceLabelPrefix) == kept {
				t.Fatalf("label %q kept=%v", k, kept)
			}
			if kept && id.Labels[k] != v {
				t.Fatalf("label %q value changed", k)
			}
		}
		if hash != coordinov1alpha1.LabelSetHash(ns, obj.Spec.Labels) {
			t.Fatal("hash differs from the controller's")
		}
	})
}
