// Package kernel probes, once at start, what the running kernel offers the
// datapath: tcx, BPF netfilter links, the kfuncs the programs may call
// (built in or in a module), the redirect helpers, netkit, and the modules
// behind routing, encryption and the nftables post-DNAT stage. The result
// is data: every optional path reads the Features table, a missing
// feature selects a fallback (never a refusal to start, never less policy),
// and the table is logged once, shown by `coordinoctl status` and exported
// as the metric coordino_kernel_feature.
package kernel
