//go:build (386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64 || wasm) && linux

package bpf

import (
	"bytes"
	_ "embed"
	"fmt"

	"github.com/cilium/ebpf"
)

// The objects built with CDO_NO_TIERS (go:generate in doc.go). The build
// constraint is the generated files': little-endian Linux.
var (
	//go:embed coordino_notiers_bpfel.o
	coordinoNotiersObject []byte
	//go:embed coordino_svcmatch_notiers_bpfel.o
	coordinoSvcmatchNotiersObject []byte
)

// LoadCoordinoNotiers returns the spec of coordino.c built without the
// tiers. It has Coordino's programs, maps and variables: load it into the
// Coordino* types.
func LoadCoordinoNotiers() (*ebpf.CollectionSpec, error) {
	return loadObject("coordino_notiers", coordinoNotiersObject)
}

// LoadCoordinoSvcmatchNotiers returns the spec of coordino_svcmatch.c built
// without the tiers, for the CoordinoSvcmatch* types.
func LoadCoordinoSvcmatchNotiers() (*ebpf.CollectionSpec, error) {
	return loadObject("coordino_svcmatch_notiers", coordinoSvcmatchNotiersObject)
}

func loadObject(name string, obj []byte) (*ebpf.CollectionSpec, error) {
	spec, err := ebpf.LoadCollectionSpecFromReader(bytes.NewReader(obj))
	if err != nil {
		return nil, fmt.Errorf("can't load %s: %w", name, err)
	}
	return spec, nil
}
