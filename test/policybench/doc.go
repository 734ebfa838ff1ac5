// Command policybench measures what NetworkPolicy enforcement costs on the
// pod↔pod path: TCP throughput (iperf3) and TCP connection rate (a Go
// dialer) between two pods on one node, with
//
//   - no policy on a node whose daemon runs --no-datapath (the bare kernel
//     path, the baseline every ratio is relative to);
//   - nftables rulesets of the same meaning on that node's host veths, as
//     one rule per port (what iptables-nft produces) and as a set lookup;
//   - Coordino with its eBPF datapath and no policy, then 10, 1k and 10k
//     rules selecting the pair.
//
// A "rule" is one (peer, protocol, port) allow: the server accepts the
// client on N TCP ports and the client may send to the server on N TCP
// ports, so both ends are isolated and every packet is checked twice.
// Coordino compiles each to one policy-map entry (2N in all, read back from
// coordino_policy_map_entries); nftables gets two chains of N rules. The
// ports the bench uses come last in every list, the worst case for a linear
// chain and irrelevant to a hash or trie lookup.
//
// Run it as root from the repository (make build ref-plugins first):
//
//	go run ./test/policybench            # full run, a few minutes
//	go run ./test/policybench -quick     # seconds; what the test runs
//	go run ./test/policybench -json
package main
