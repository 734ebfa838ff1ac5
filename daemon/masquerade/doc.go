// Package masquerade owns the kernel NAT that lets pods reach what lies
// outside the cluster: an nftables table "coordino-nat" (family inet) whose
// postrouting chain masquerades, to the address of the egress interface,
// connections from the cluster's pod CIDRs to destinations outside every
// pod CIDR, node address, Service range, configured non-masquerade range
// and network of a chained attachment's pod (bounded by ChainedNetwork). The ranges live in interval sets that Apply updates by element
// deltas; the first Apply of a process replaces the whole table in one
// transaction, so a restarting daemon never leaves a moment without it.
// It speaks netlink (no nft binary) and serves either datapath: it runs
// after the datapath's egress policy, which judged the pod's own address.
package masquerade
