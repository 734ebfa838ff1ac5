//go:build (386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64 || wasm) && linux

package bpf

import (
	"testing"

	"github.com/cilium/ebpf"
)

// TestNotiersFitTieredTypes: each object built without the tiers has every
// program, map and variable of its tiered build's bindings, which the
// datapath loads it into.
func TestNotiersFitTieredTypes(t *testing.T) {
	for _, c := range []struct {
		name string
		load func() (*ebpf.CollectionSpec, error)
		into any
	}{
		{"coordino_notiers", LoadCoordinoNotiers, &CoordinoSpecs{}},
		{"coordino_svcmatch_notiers", LoadCoordinoSvcmatchNotiers, &CoordinoSvcmatchSpecs{}},
	} {
		spec, err := c.load()
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if err := spec.Assign(c.into); err != nil {
			t.Errorf("%s does not fit the tiered types: %v", c.name, err)
		}
		if _, tiered := spec.Variables["cdo_have_tiers"]; !tiered {
			t.Errorf("%s has no cdo_have_tiers (the datapath sets it)", c.name)
		}
	}
}
