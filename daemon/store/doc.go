// Package store is the daemon's single source of truth: one persistent record
// per pod attachment, keyed by (network name, container ID, ifname), in a
// bbolt file under the state directory. A record holds the attachment's
// addresses, so an address reservation and its endpoint commit in one
// transaction; DEL, CHECK, GC and restart reconciliation all read from here.
// Concurrent writes share transactions (group commit), each returning once
// its transaction is durable.
package store
