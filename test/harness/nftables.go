package harness

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/google/nftables"
)

// The nftables datapath's table and the verdict maps that send a pod
// interface's packets to its chains (daemon/nftdp).
const (
	nftTable  = "coordino-policy"
	nftEpsIn  = "eps-in"
	nftEpsOut = "eps-out"
)

// NFTablesEndpoints reads the node's nftables datapath (--datapath=nftables):
// the sorted host interfaces its eps-in map sends to an endpoint chain,
// and the number of endpoint records in the state dir. An interface in
// only one of eps-in and eps-out is an error: half an endpoint.
func (n *Node) NFTablesEndpoints() (ifnames []string, records int, err error) {
	c, err := nftables.New(nftables.WithNetNSFd(int(n.NS.Fd())))
	if err != nil {
		return nil, 0, err
	}
	table := &nftables.Table{Family: nftables.TableFamilyINet, Name: nftTable}
	read := func(name string) ([]string, error) {
		s, err := c.GetSetByName(table, name)
		if err != nil {
			return nil, fmt.Errorf("nftables set %s of inet %s: %w", name, nftTable, err)
		}
		elems, err := c.GetSetElements(s)
		if err != nil {
			return nil, fmt.Errorf("nftables set %s: %w", name, err)
		}
		var out []string
		for _, e := range elems {
			out = append(out, strings.TrimRight(string(e.Key), "\x00"))
		}
		slices.Sort(out)
		return out, nil
	}
	in, err := read(nftEpsIn)
	if err != nil {
		return nil, 0, err
	}
	out, err := read(nftEpsOut)
	if err != nil {
		return nil, 0, err
	}
	if !slices.Equal(in, out) {
		return nil, 0, fmt.Errorf("nftables endpoints: %s holds %v, %s %v", nftEpsIn, in, nftEpsOut, out)
	}
	files, err := filepath.Glob(filepath.Join(n.StateDir, "nftables", "*.json"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, 0, err
	}
	return in, len(files), nil
}
