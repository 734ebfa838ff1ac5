package kernels

import "time"

// Suite is one test binary of the matrix, with the tests it runs.
type Suite struct {
	Name    string
	Package string   // relative to the repository root
	Run     string   // -test.run
	Skip    string   // -test.skip
	Modules []string // loaded in a guest before the suite runs
	Timeout time.Duration
}

// conntrack is loaded for every suite, as on every kube-proxy node: with
// nf_conntrack a module, BPF programs that call its kfuncs meet module BTF.
var conntrack = []string{"nf_conntrack", "nf_defrag_ipv4", "nf_defrag_ipv6"}

// Suites is the matrix's list. Under TCG a guest runs code 6-15x slower
// than the host, so each suite runs a subset chosen to stay within about
// five minutes per guest; the comment of each says what it covers.
var Suites = []Suite{
	{
		// BPF loading in both attach modes, per-packet verdicts through
		// real veths, restart adoption, the tunnel decap program.
		Name: "datapath", Package: "./daemon/datapath",
		Run:     `^(TestPolicyEnforcement|TestVerdicts|TestRestartAdoption|TestNewEndpointDeniedFromFirstPacket|TestTunnelDecap|TestTunnelConfig)$`,
		Modules: []string{"veth", "sch_ingress", "cls_bpf", "vxlan"},
		Timeout: 3 * time.Minute,
	},
}
