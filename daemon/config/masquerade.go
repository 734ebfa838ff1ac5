package config

import (
	"flag"
	"net/netip"
)

// Masquerade configures the NAT of traffic leaving the cluster (see
// daemon/masquerade and docs/operations.md, "Traffic leaving the cluster").
type Masquerade struct {
	// Masquerade SNATs pods' connections to destinations outside the
	// cluster to the node's address. On by default: the chained overlay
	// turns it off, as the primary CNI decides there.
	Masquerade bool `json:"masquerade"`
	// NonMasqueradeCIDRs are destinations pods reach with their own
	// address (a routed corporate network, a peered VPC).
	NonMasqueradeCIDRs []string `json:"nonMasqueradeCIDRs"`

	// NonMasqueradePrefixes is NonMasqueradeCIDRs parsed.
	NonMasqueradePrefixes []netip.Prefix `json:"-"`
}

func (m *Masquerade) register(fs *flag.FlagSet) {
	fs.BoolVar(&m.Masquerade, "masquerade", m.Masquerade, "SNAT pods' connections to destinations outside every pod CIDR, node address, Service range and --non-masquerade-cidrs to the node's address on the egress interface (off: pods leave with their own address; the chained overlay sets it off)")
	fs.Var(listFlag{&m.NonMasqueradeCIDRs}, "non-masquerade-cidrs", "destinations outside the cluster that pods reach with their own address, comma-separated or repeated (the config file's nonMasqueradeCIDRs)")
}

func (m *Masquerade) applyFlags(flags *Masquerade, set map[string]func()) {
	set["masquerade"] = func() { m.Masquerade = flags.Masquerade }
	set["non-masquerade-cidrs"] = func() { m.NonMasqueradeCIDRs = flags.NonMasqueradeCIDRs }
}

func (m *Masquerade) validate() (err error) {
	m.NonMasqueradePrefixes, err = parsePrefixes("non-masquerade-cidrs", m.NonMasqueradeCIDRs)
	return err
}
