package identity

import (
	"fmt"
	"net/netip"
	"sync"
)

// CIDRs hands out node-local identities for ipBlock prefixes. A prefix keeps
// its number while it is in use, so recompiling policy does not churn maps.
type CIDRs struct {
	mu       sync.Mutex
	byPrefix map[netip.Prefix]ID
	used     map[ID]bool
	next     ID
}

// NewCIDRs returns an empty CIDR identity table.
func NewCIDRs() *CIDRs {
	return &CIDRs{byPrefix: map[netip.Prefix]ID{}, used: map[ID]bool{}, next: CIDRFlag | 1}
}

// Restore re-registers prefix → id found in the pinned ipcache.
func (c *CIDRs) Restore(p netip.Prefix, id ID) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !id.IsCIDR() {
		return fmt.Errorf("restore CIDR %s: %d is not a CIDR identity", p, id)
	}
	p = p.Masked()
	if old, ok := c.byPrefix[p]; ok && old != id {
		return fmt.Errorf("restore CIDR %s: already identity %d", p, old)
	}
	if c.used[id] {
		if c.byPrefix[p] == id {
			return nil
		}
		return fmt.Errorf("restore CIDR %s: identity %d used by another prefix", p, id)
	}
	c.byPrefix[p], c.used[id] = id, true
	return nil
}

// Get returns the identity of p, allocating one if needed.
func (c *CIDRs) Get(p netip.Prefix) (ID, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	p = p.Masked()
	if id, ok := c.byPrefix[p]; ok {
		return id, nil
	}
	for range maxCIDR - CIDRFlag {
		n := c.next
		if c.next++; c.next > maxCIDR {
			c.next = CIDRFlag | 1
		}
		if !c.used[n] {
			c.byPrefix[p], c.used[n] = n, true
			return n, nil
		}
	}
	return 0, fmt.Errorf("allocate CIDR identity for %s: table full", p)
}

// Retain forgets every prefix not in keep.
func (c *CIDRs) Retain(keep map[netip.Prefix]bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for p, id := range c.byPrefix {
		if !keep[p] {
			delete(c.byPrefix, p)
			delete(c.used, id)
		}
	}
}

// Release forgets p. Numbers are handed out round-robin, so a released one
// is reused only after the rest of the CIDR range: an ipcache entry still
// carrying it cannot be mistaken for a new prefix's in the meantime.
func (c *CIDRs) Release(p netip.Prefix) {
	c.mu.Lock()
	defer c.mu.Unlock()
	p = p.Masked()
	if id, ok := c.byPrefix[p]; ok {
		delete(c.byPrefix, p)
		delete(c.used, id)
	}
}
