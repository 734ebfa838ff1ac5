package policy

import (
	"cmp"
	"net/netip"
	"slices"

	"github.com/coordino/coordino/daemon/identity"
)

// NamespaceNameLabel is set on every namespace by the API server; standalone
// mode sets it too so namespaceSelector can pick namespaces by name.
const NamespaceNameLabel = "kubernetes.io/metadata.name"

// Compile runs the whole pipeline once over a snapshot: normalize every
// policy, feed a fresh Engine, and read back the rules for in.Local. The
// datapath drives an Engine incrementally instead; Compile is the one-shot
// form for tools and tests. Invalid policies are skipped and reported in the
// error; the rest compile.
func Compile(in Input, cidrs *identity.CIDRs) (*Result, error) {
	e := NewEngine(cidrs)
	for _, ns := range in.Namespaces {
		e.SetNamespace(ns.Name, ns.Labels)
	}
	for _, n := range in.Nodes {
		e.SetNode(n.Name, n.Labels, NodeAddrs(n))
	}
	local := map[identity.ID]bool{}
	for _, id := range in.Local {
		local[id] = true
	}
	for _, id := range in.Identities {
		if local[id.ID] {
			e.AddLocal(id)
		} else {
			e.UpsertIdentity(id)
		}
	}
	for _, p := range in.NamedPorts {
		e.SetNamedPorts(p)
	}
	var errs []error
	for _, o := range in.Objects() {
		p, err := o.Normalize()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		e.UpsertPolicy(p)
	}
	errs = append(errs, e.TakeErrors()...)
	res := &Result{Isolation: map[identity.ID]Isolation{}, CIDRs: map[netip.Prefix]identity.ID{}}
	for id := range local {
		if iso := e.Isolation(id); iso != 0 {
			res.Isolation[id] = iso
		}
	}
	e.Rules(func(r Rule) { res.Rules = append(res.Rules, r) })
	res.Values = map[Key]Value{}
	e.Keys(func(k Key) { res.Values[k] = e.KeyValue(k) })
	slices.SortFunc(res.Rules, compareRules)
	e.Prefixes(func(p netip.Prefix, id identity.ID) { res.CIDRs[p] = id })
	res.Warnings = e.Warnings()
	slices.Sort(res.Warnings)
	res.Warnings = slices.Compact(res.Warnings)
	if len(errs) > 0 {
		return res, joinErrors(errs)
	}
	return res, nil
}

func compareRules(a, b Rule) int {
	return cmp.Or(cmp.Compare(a.Local, b.Local), cmp.Compare(a.Dir, b.Dir), cmp.Compare(a.Remote, b.Remote),
		cmp.Compare(a.Proto, b.Proto), cmp.Compare(a.PortLo, b.PortLo), cmp.Compare(a.PortHi, b.PortHi))
}

type joined []error

func (j joined) Error() string {
	s := j[0].Error()
	for _, e := range j[1:] {
		s += "; " + e.Error()
	}
	return s
}

func (j joined) Unwrap() []error { return j }

func joinErrors(errs []error) error { return joined(errs) }
