// Package endpoint configures pod attachments: it is where ADD, DEL, CHECK,
// GC and STATUS are carried out, in primary mode (veth, addresses, routes)
// and chained mode (attach to another plugin's interface). It serialises the
// operations of one attachment while different attachments proceed in
// parallel, and it keeps the endpoint store, IPAM and the kernel in step so
// that a crash at any point leaves only what GC or restart can reclaim.
// It reaches the kernel, the datapath and the store only through the
// interfaces it declares (interfaces.go), so its tests run without root.
package endpoint
