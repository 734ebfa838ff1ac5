package policy

import (
	"testing"

	"github.com/coordino/coordino/api/policyir"
	"github.com/coordino/coordino/daemon/identity"
)

// namedPortFixture: local identity web (a/app=web) and identity db
// (a/app=db) known; policies name ports "http" and "pg".
type namedPortFixture struct {
	t       *testing.T
	e       *Engine
	web, db identity.Identity
}

func newNamedPortFixture(t *testing.T, policies ...string) *namedPortFixture {
	f := &namedPortFixture{t: t, e: NewEngine(identity.NewCIDRs()),
		web: identity.Identity{ID: 300, Namespace: "a", Labels: map[string]string{"app": "web"}},
		db:  identity.Identity{ID: 400, Namespace: "a", Labels: map[string]string{"app": "db"}}}
	f.e.AddLocal(f.web)
	f.e.UpsertIdentity(f.db)
	for _, np := range mustPolicies(t, policies...) {
		p, err := policyir.Normalize(np)
		if err != nil {
			t.Fatal(err)
		}
		f.e.UpsertPolicy(p)
	}
	return f
}

func (f *namedPortFixture) allowed(local, remote identity.ID, dir Direction, proto uint8, port uint16) bool {
	tbl := Table{}
	f.e.Keys(func(k Key) { tbl[k] = struct{}{} })
	return tbl.Allowed(Flow{Local: local, Isolation: f.e.Isolation(local), Dir: dir, Remote: remote, RemoteCIDR: identity.World, Proto: proto, Port: port})
}

// expect checks the verdict of each port for (local, remote, dir) over TCP.
func (f *namedPortFixture) expect(what string, local, remote identity.ID, dir Direction, want map[uint16]bool) {
	f.t.Helper()
	for port, ok := range want {
		if got := f.allowed(local, remote, dir, ProtoTCP, port); got != ok {
			f.t.Errorf("%s: %s %s %s tcp/%d allowed=%v, want %v", what, local, dir, remote, port, got, ok)
		}
	}
}

const ingressHTTP = `
metadata: {name: web-http, namespace: a}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress: [{from: [{podSelector: {matchLabels: {app: db}}}], ports: [{port: http}, {port: 9000}]}]`

func TestNamedPortIngressResolvesAgainstLocalPods(t *testing.T) {
	f := newNamedPortFixture(t, ingressHTTP)
	f.expect("no pod defines http", 300, 400, Ingress, map[uint16]bool{80: false, 9000: true})

	f.e.SetNamedPorts(PodPorts{Key: "local/w1", ID: 300, Local: true, Ports: []NamedPort{{Name: "http", Protocol: ProtoTCP, Port: 80}}})
	f.expect("one local pod: http=80", 300, 400, Ingress, map[uint16]bool{80: true, 8080: false, 9000: true})

	// A pod of the same identity elsewhere never widens ingress here.
	f.e.SetNamedPorts(PodPorts{Key: "node2/w2", ID: 300, Ports: []NamedPort{{Name: "http", Protocol: ProtoTCP, Port: 8081}}})
	f.expect("remote pod of the same identity", 300, 400, Ingress, map[uint16]bool{80: true, 8081: false})

	// Two local pods of one identity numbering http differently: the union.
	f.e.SetNamedPorts(PodPorts{Key: "local/w3", ID: 300, Local: true, Ports: []NamedPort{{Name: "http", Protocol: ProtoTCP, Port: 8080}}})
	f.expect("two local pods", 300, 400, Ingress, map[uint16]bool{80: true, 8080: true, 8081: false})
	// Wrong protocol or wrong name allow nothing.
	f.e.SetNamedPorts(PodPorts{Key: "local/w4", ID: 300, Local: true, Ports: []NamedPort{{Name: "http", Protocol: ProtoUDP, Port: 7000}, {Name: "other", Protocol: ProtoTCP, Port: 7001}}})
	f.expect("udp http and other name", 300, 400, Ingress, map[uint16]bool{7000: false, 7001: false})
	if f.allowed(300, 400, Ingress, ProtoUDP, 7000) {
		t.Error("policy names TCP http, UDP http allowed")
	}

	// The pod with 8080 goes: only its number goes.
	f.e.RemoveNamedPorts("local/w3")
	f.expect("after removing w3", 300, 400, Ingress, map[uint16]bool{80: true, 8080: false})
	// Replacing a pod's ports moves the number.
	f.e.SetNamedPorts(PodPorts{Key: "local/w1", ID: 300, Local: true, Ports: []NamedPort{{Name: "http", Protocol: ProtoTCP, Port: 81}}})
	f.expect("w1 moved to 81", 300, 400, Ingress, map[uint16]bool{80: false, 81: true, 9000: true})
	// The last local endpoint of the identity leaves, then comes back.
	f.e.RemoveLocal(300)
	f.e.AddLocal(f.web)
	f.expect("identity re-added", 300, 400, Ingress, map[uint16]bool{81: true, 80: false})
	// Source from a different (non-peer) identity: denied whatever port.
	f.expect("non-peer", 300, 999, Ingress, map[uint16]bool{81: false})
}

func TestNamedPortEgressResolvesAgainstPeerPods(t *testing.T) {
	f := newNamedPortFixture(t, `
metadata: {name: web-to-db, namespace: a}
spec:
  podSelector: {matchLabels: {app: web}}
  policyTypes: [Egress]
  egress:
  - {to: [{podSelector: {matchLabels: {app: db}}}], ports: [{port: pg}]}
  - {ports: [{port: dns, protocol: UDP}]}`)
	f.expect("no db pod known", 300, 400, Egress, map[uint16]bool{5432: false})
	// A remote db pod (from another node's feed) defines pg.
	f.e.SetNamedPorts(PodPorts{Key: "node2/db1", ID: 400, Ports: []NamedPort{{Name: "pg", Protocol: ProtoTCP, Port: 5432}}})
	// A web pod's own pg port is not the peer's.
	f.e.SetNamedPorts(PodPorts{Key: "local/w1", ID: 300, Local: true, Ports: []NamedPort{{Name: "pg", Protocol: ProtoTCP, Port: 6000}}})
	f.expect("remote db pod", 300, 400, Egress, map[uint16]bool{5432: true, 6000: false})
	// A local db pod adds its number: the union over the identity's pods.
	f.e.SetNamedPorts(PodPorts{Key: "local/db2", ID: 400, Local: true, Ports: []NamedPort{{Name: "pg", Protocol: ProtoTCP, Port: 5433}}})
	f.expect("local and remote db pods", 300, 400, Egress, map[uint16]bool{5432: true, 5433: true, 6000: false})
	f.e.RemoveNamedPorts("node2/db1")
	f.expect("remote db pod gone", 300, 400, Egress, map[uint16]bool{5432: false, 5433: true})

	// "Every peer" on a named port: the union over every known pod.
	if f.allowed(300, identity.World, Egress, ProtoUDP, 53) {
		t.Error("dns allowed before any pod defines it")
	}
	f.e.SetNamedPorts(PodPorts{Key: "node3/coredns", ID: 500, Ports: []NamedPort{{Name: "dns", Protocol: ProtoUDP, Port: 53}}})
	if !f.allowed(300, identity.World, Egress, ProtoUDP, 53) || f.allowed(300, identity.World, Egress, ProtoTCP, 53) {
		t.Error("dns (UDP 53) not resolved for every peer, or TCP allowed")
	}
	f.e.RemoveNamedPorts("node3/coredns")
	if f.allowed(300, identity.World, Egress, ProtoUDP, 53) {
		t.Error("dns still allowed after its only pod left")
	}
}

// TestNamedPortChangesAreLocal: a pod's ports changing reports only the keys
// of rules naming that port, and an unchanged update reports nothing.
func TestNamedPortChangesAreLocal(t *testing.T) {
	f := newNamedPortFixture(t, ingressHTTP, denyIngressA)
	f.e.TakeChanges()
	w1 := PodPorts{Key: "local/w1", ID: 300, Local: true, Ports: []NamedPort{{Name: "http", Protocol: ProtoTCP, Port: 80}, {Name: "unused", Protocol: ProtoTCP, Port: 99}}}
	f.e.SetNamedPorts(w1)
	ch := f.e.TakeChanges()
	want := Key{Prefix: PrefixFull, Local: 300, Remote: 400, Dir: Ingress, Proto: ProtoTCP, Port: 80}
	if len(ch.Keys) != 1 || !f.e.WantsKey(want) {
		t.Fatalf("changed keys %v, want only %+v", ch.Keys, want)
	}
	f.e.SetNamedPorts(w1)
	if ch := f.e.TakeChanges(); !ch.Empty() {
		t.Fatalf("same ports again changed %v", ch)
	}
	f.e.SetNamedPorts(PodPorts{Key: "local/w1", ID: 300, Local: true, Ports: []NamedPort{{Name: "http", Protocol: ProtoTCP, Port: 80}, {Name: "unused", Protocol: ProtoTCP, Port: 98}}})
	if ch := f.e.TakeChanges(); len(ch.Keys) != 0 {
		t.Fatalf("a port no rule names changed keys %v", ch.Keys)
	}
	f.e.RemoveNamedPorts("local/w1")
	if ch := f.e.TakeChanges(); len(ch.Keys) != 1 || f.e.WantsKey(want) {
		t.Fatalf("removal changed %v, want the http key gone", ch.Keys)
	}
	if len(f.e.named.local)+len(f.e.named.peer)+len(f.e.named.all)+len(f.e.named.pods) != 0 {
		t.Fatalf("named-port tables not empty after the last pod left: %+v", f.e.named)
	}
}
