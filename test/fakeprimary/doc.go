// Command fakeprimary is a test-only primary CNI plugin that builds real
// kernel objects (a veth pair, addresses from a delegated IPAM plugin,
// routes) but prints its result in the JSON shape of a named third-party
// CNI, so chained-mode tests can check that Coordino finds the pod
// interface however the primary describes it. Only the result's shape is
// imitated; nothing of those projects is used.
//
// Config: {"type":"fakeprimary","shape":"<shape>","ipam":{...}} with shape
//
//	calico      interfaces: the host veth only; ips: no interface index
//	aws-vpc     host veth, pod interface with sandbox, a "dummy" entry whose
//	            sandbox field holds a device number; ips point at the pod interface
//	aws-legacy  the host veth only; ips without interface index
//	no-sandbox  host veth and pod interface, the pod interface without sandbox
//	flannel     delegates to "delegate" (e.g. the bridge plugin) and returns its result
package main
