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
// With -scale it measures the control plane instead (scale.go): ADD latency
// through libcni with 0, 1,000 and 10,000 NetworkPolicies loaded, each pod a
// new label set, sequentially and 16 at a time, as ratios to the 0-policy
// figures of the same run; and the time from a policy file change to the
// new verdict on the wire at 10,000 policies (make bench-policy).
//
// Run it as root from the repository (make build ref-plugins first):
//
//	go run ./test/policybench            # full run, a few minutes
//	go run ./test/policybench -quick     # seconds; what the test runs
//	go run ./test/policybench -json
//	go run ./test/policybench -datapath nftables   # Coordino's node on nftables
//	go run ./test/policybench -scale     # policy scale, several minutes
//	go run ./test/policybench -scale -quick
package main
