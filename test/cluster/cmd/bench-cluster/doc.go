// Command bench-cluster measures pod startup at density on the multi-node
// bed (test/cluster), with Coordino and then with the reference
// bridge + host-local CNI in the same run, and prints the ratio.
//
// Per CNI: a fresh bed with three workers; 110 pods per node created at a
// fixed rate; then churn (delete the oldest pod of a node, create a new
// one) at 500 pods per node per minute; then every pod deleted. It reports
// pod created → Running as seen through a watch (the upstream pod-startup
// SLI) p50/p99 for both phases, the kubelet's sandbox creation p50/p99, CNI
// ADD p50/p99 from Coordino's daemons' metrics, Warning events (count and
// reasons), and what each node holds afterwards that it did not hold before
// (addresses, veths, netns pins, BPF map entries, files).
//
// Run it through `make bench-cluster` (it builds what it needs). The bed is
// a singleton: nothing else may run a cluster on the machine meanwhile.
package main
