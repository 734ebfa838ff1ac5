// Command bench measures CNI ADD and DEL latency through libcni, the library
// container runtimes use, for Coordino and for the reference bridge+host-local
// plugins side by side in one run, and the extra cost of chaining Coordino
// after bridge+host-local, next to that of chaining a Go plugin that does
// nothing (chainnoop).
//
// Every system runs on its own harness node (a network namespace; Coordino's
// with its own coordino-daemon), and libcni is driven from inside that node
// namespace so bridges and veths never land in the host namespace. Pod
// namespaces are created before a mode's first round, outside the timed
// region, and reused by every round under fresh container IDs. Rounds rotate
// the order of the systems so machine noise hits them all alike.
//
// Run it as root after `make build ref-plugins`:
//
//	go run ./test/bench [-n 200] [-concurrency 16] [-rounds 10] [-warmup 10] [-quick] [-json]
//
// It only reports numbers and the targets they are read against; it never
// fails on a missed target. Ctrl-C or SIGTERM stops it after the operations in
// flight and still tears everything down.
package main
