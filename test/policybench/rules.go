package main

import (
	"fmt"
	"strings"
)

// portsPerPolicy keeps each NetworkPolicy a plausible size; 10k rules per
// end are 100 policies per end.
const portsPerPolicy = 100

// policyYAML isolates both pods: the server accepts the client, the client
// may reach the server, each on the same n TCP ports. Every port of every
// rule compiles to exactly one policy-map entry, 2n in all.
func policyYAML(n int) string {
	ports := benchPorts(n)
	var b strings.Builder
	for i := 0; i*portsPerPolicy < len(ports); i++ {
		chunk := ports[i*portsPerPolicy : min(len(ports), (i+1)*portsPerPolicy)]
		var list strings.Builder
		for _, p := range chunk {
			fmt.Fprintf(&list, "    - {protocol: TCP, port: %d}\n", p)
		}
		fmt.Fprintf(&b, `---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: server-in-%d, namespace: bench}
spec:
  podSelector: {matchLabels: {role: server}}
  policyTypes: [Ingress]
  ingress:
  - from: [{podSelector: {matchLabels: {role: client}}}]
    ports:
%s---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: client-out-%d, namespace: bench}
spec:
  podSelector: {matchLabels: {role: client}}
  policyTypes: [Egress]
  egress:
  - to: [{podSelector: {matchLabels: {role: server}}}]
    ports:
%s`, i, list.String(), i, list.String())
	}
	return b.String()
}

// nftDelete removes the bench table if present ("add" first makes the
// delete valid when there is none).
const nftDelete = "add table inet cdo_bench\ndelete table inet cdo_bench\n"

// nftRuleset has the meaning of policyYAML for the two pods' host veths,
// written the way an iptables-based policy agent does: established and
// related packets pass first, then a new flow must pass the client's
// egress chain and the server's ingress chain, each a list of n
// (peer, port) rules ending in a drop. With sets, each chain is one set
// lookup instead.
func nftRuleset(sets bool, n int, client, server *benchPod) string {
	ports := benchPorts(n)
	var b strings.Builder
	b.WriteString(nftDelete)
	b.WriteString("table inet cdo_bench {\n")
	if sets {
		elems := make([]string, len(ports))
		for i, p := range ports {
			elems[i] = fmt.Sprint(p)
		}
		fmt.Fprintf(&b, "  set allowed_ports {\n    type inet_service\n    elements = { %s }\n  }\n", strings.Join(elems, ", "))
	}
	fmt.Fprintf(&b, `  chain forward {
    type filter hook forward priority filter; policy accept;
    ct state established,related accept
    iifname %q jump client_egress
    oifname %q jump server_ingress
  }
`, client.hostIf, server.hostIf)
	chain := func(name, match string) {
		fmt.Fprintf(&b, "  chain %s {\n", name)
		if sets {
			fmt.Fprintf(&b, "    %s tcp dport @allowed_ports return\n", match)
		} else {
			for _, p := range ports {
				fmt.Fprintf(&b, "    %s tcp dport %d return\n", match, p)
			}
		}
		b.WriteString("    drop\n  }\n")
	}
	chain("client_egress", "ip daddr "+server.ip.String())
	chain("server_ingress", "ip saddr "+client.ip.String())
	b.WriteString("}\n")
	return b.String()
}
