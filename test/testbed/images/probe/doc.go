// Command probe is the test image's only program: a static TCP/UDP echo
// server and a client that checks an echo round trip. Test images have no
// shell or busybox (Debian's static busybox wget segfaults), so everything the
// runtime e2e does inside a pod goes through this binary.
//
//	probe serve [-port 8080]            echo server on TCP and UDP, all addresses
//	probe dial tcp|udp HOST:PORT        sends a token, expects it echoed, exit 0/1
//	probe addrs                         prints the pod's interface addresses
package main
