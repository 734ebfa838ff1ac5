package policy

import (
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
)

// indexRequirement picks the requirement a selector is indexed under: of its
// key=value and key in (values) requirements, the one with the fewest
// values (ties: the first, by key). A label set can match the selector only
// if it has that key with one of those values. ok is false for selectors
// without such a requirement (empty, Exists, NotIn, DoesNotExist only):
// those must be checked against every label set.
func indexRequirement(sel labels.Selector) (key string, values []string, ok bool) {
	reqs, selectable := sel.Requirements()
	if !selectable {
		return "", nil, true // labels.Nothing(): indexed under no value at all
	}
	for _, r := range reqs {
		switch r.Operator() {
		case selection.Equals, selection.DoubleEquals, selection.In:
			if vs := r.ValuesUnsorted(); !ok || len(vs) < len(values) {
				key, values, ok = r.Key(), vs, true
			}
		}
	}
	return key, values, ok
}

// selectorIndex finds, for a label set, the items whose selector may match
// it without looking at the others: items are filed under their selector's
// index requirement. Candidates are a superset; callers check Matches.
type selectorIndex[T comparable] struct {
	byLabel map[string]map[string]map[T]struct{}
	scan    map[T]struct{}
}

func newSelectorIndex[T comparable]() *selectorIndex[T] {
	return &selectorIndex[T]{byLabel: map[string]map[string]map[T]struct{}{}, scan: map[T]struct{}{}}
}

func (x *selectorIndex[T]) add(sel labels.Selector, item T) {
	key, values, ok := indexRequirement(sel)
	if !ok {
		x.scan[item] = struct{}{}
		return
	}
	byValue := x.byLabel[key]
	if byValue == nil {
		byValue = map[string]map[T]struct{}{}
		x.byLabel[key] = byValue
	}
	for _, v := range values {
		set := byValue[v]
		if set == nil {
			set = map[T]struct{}{}
			byValue[v] = set
		}
		set[item] = struct{}{}
	}
}

func (x *selectorIndex[T]) remove(sel labels.Selector, item T) {
	key, values, ok := indexRequirement(sel)
	if !ok {
		delete(x.scan, item)
		return
	}
	byValue := x.byLabel[key]
	for _, v := range values {
		delete(byValue[v], item)
		if len(byValue[v]) == 0 {
			delete(byValue, v)
		}
	}
	if len(byValue) == 0 {
		delete(x.byLabel, key)
	}
}

// candidates calls fn once for every item whose selector may match set.
func (x *selectorIndex[T]) candidates(set map[string]string, fn func(T)) {
	for item := range x.scan {
		fn(item)
	}
	for k, v := range set {
		for item := range x.byLabel[k][v] {
			fn(item)
		}
	}
}

// labelSetIndex is the reverse: label sets filed by each key=value, so the
// sets a selector may match are found through its index requirement.
type labelSetIndex[T comparable] struct {
	all     map[T]struct{}
	byLabel map[string]map[string]map[T]struct{}
}

func newLabelSetIndex[T comparable]() *labelSetIndex[T] {
	return &labelSetIndex[T]{all: map[T]struct{}{}, byLabel: map[string]map[string]map[T]struct{}{}}
}

func (x *labelSetIndex[T]) add(set map[string]string, item T) {
	x.all[item] = struct{}{}
	for k, v := range set {
		byValue := x.byLabel[k]
		if byValue == nil {
			byValue = map[string]map[T]struct{}{}
			x.byLabel[k] = byValue
		}
		items := byValue[v]
		if items == nil {
			items = map[T]struct{}{}
			byValue[v] = items
		}
		items[item] = struct{}{}
	}
}

func (x *labelSetIndex[T]) remove(set map[string]string, item T) {
	delete(x.all, item)
	for k, v := range set {
		delete(x.byLabel[k][v], item)
		if len(x.byLabel[k][v]) == 0 {
			delete(x.byLabel[k], v)
		}
		if len(x.byLabel[k]) == 0 {
			delete(x.byLabel, k)
		}
	}
}

// candidates calls fn once for every item sel may match (a superset).
func (x *labelSetIndex[T]) candidates(sel labels.Selector, fn func(T)) {
	key, values, ok := indexRequirement(sel)
	if !ok {
		for item := range x.all {
			fn(item)
		}
		return
	}
	for _, v := range values {
		for item := range x.byLabel[key][v] {
			fn(item)
		}
	}
}
