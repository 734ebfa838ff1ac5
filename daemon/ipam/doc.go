// Package ipam allocates pod addresses from node-scoped blocks with one
// bitmap per block. It is pure bookkeeping in memory: persistence is the
// endpoint store's job (an address is in use exactly when a stored endpoint
// holds it), so the daemon rebuilds the allocator from the store at start.
package ipam
