// Package fault holds the randomized fault test: a seeded sequence of ADD,
// DEL, CHECK and GC through libcni on one node, on a primary network and on
// one chained after the reference bridge plugin, with container restarts
// (an ID deleted and added again), and the daemon SIGKILLed at random
// points (inside operations, between them and during its own recovery) and
// restarted, as kubelet would; TestRandomFaultsNFTables does the same on
// --datapath=nftables. It ends by checking that nothing leaked (addresses, veths,
// netns pins, store records, BPF endpoint entries, queued DELs) and that
// every surviving pod is enforced by its default-deny policy.
//
// COORDINO_FAULT_SEED reruns a given sequence; COORDINO_FAULT_OPS changes
// its length (default 1000).
package fault
