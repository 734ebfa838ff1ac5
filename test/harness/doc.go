// Package harness builds node-level test beds out of real kernel parts:
// a network namespace per "node" running its own coordino-daemon (started
// with nsenter --net, keeping the host mount namespace so /sys/fs/bpf is
// real), a network namespace per "pod", and a libcni driver that invokes the
// plugins exactly as container runtimes do, with its own result cache.
// Tests, the demo and the benchmarks all stand on it.
package harness
