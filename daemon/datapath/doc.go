// Package datapath loads Coordino's eBPF programs, keeps their maps pinned
// under the BPF directory and attaches them to the host side of every
// endpoint (tcx links, or clsact + cls_bpf where tcx is missing). It owns the
// translation of identities and compiled policy into map entries, and adopts
// all pinned state when the daemon restarts, so enforcement has no gap.
package datapath
