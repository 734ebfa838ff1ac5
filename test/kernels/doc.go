// Package kernels is the kernel matrix (`make test-kernels`): it runs a list
// of privileged suites on the host's kernel and, under qemu, on Debian's own
// 6.1 and 6.12 kernels, and prints each test's result per kernel with a
// summary table.
//
// A guest kernel comes from its Debian package (apt-get download, dpkg-deb
// -x, depmod), cached under CacheDir together with the ELF taken out of its
// bzImage, which qemu boots through the PVH entry without running the slow
// decompressor. The guest's initramfs holds busybox, the modules needed to
// reach the host (virtio, 9p, overlay) and init.sh, which mounts the host's
// / read-only over virtio-9p under a tmpfs overlay, so the guest has the Go
// toolchain, the repository and the test binaries built on the host, and a
// second, writable 9p share for the results. The harness binary itself then
// runs as the guest's first process (Guest): it loads each suite's modules,
// runs the suite's test binary with -test.v=test2json, and powers off.
//
// Guests run under TCG (this machine's /dev/kvm cannot run stock kernels),
// 6-15x slower than native; the harness sets COORDINO_TEST_SLOWDOWN, which
// the tests' waits read through test/privileged.Slowdown.
package kernels
