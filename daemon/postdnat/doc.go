// Package postdnat owns the nftables chains that run the datapath's
// post-DNAT decision on kernels without BPF netfilter links (before 6.4):
// per family, a table "coordino-services" whose chain hooks PREROUTING
// right after kube-proxy's DNAT (priority dstnat + 1, the netfilter link's
// place on newer kernels) and hands packets of connections first addressed
// to a Service CIDR to a BPF socket filter program through the xtables BPF
// match (bpf/coordino_svcmatch.c). It speaks netlink (no nft binary), and
// replaces its rules in one transaction, so a restarting daemon's new
// program takes over with no gap and no moment without the stage.
package postdnat
