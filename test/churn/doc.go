// Command churn is the sustained pod-churn benchmark (`make bench-churn`):
// one node with coordino-daemon (policies loaded from --policy-dir, flow
// observation on) takes ADDs and DELs interleaved at a fixed pod rate, pods
// with fresh and repeated label sets, each pod connecting once to a server
// pod. It reports ADD/DEL latency, errors, the daemon's CPU and RSS over
// time with their slopes, and afterwards checks that nothing leaked against
// the state before the first pod: host veths, netns pins, addresses,
// endpoint records, and the BPF endpoint, ipcache, policy and conntrack maps.
// DEL leaves a pod's conntrack entries to the daemon's background purge, so
// those checks first wait (bounded) until coordino_conntrack_purge_pending
// is 0: a purge that never completes fails the run.
package main
