package netsetup

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
)

// HostIfPrefix starts the name of every host-side veth Coordino creates.
const HostIfPrefix = "cdo"

// maxIfNameLen is IFNAMSIZ-1, the longest interface name the kernel accepts.
const maxIfNameLen = 15

// HostIfName returns the host-side veth name for (network, containerID,
// ifname): HostIfPrefix plus 12 hex digits of a SHA-256 over the three,
// always exactly 15 characters, so DEL and GC can find it without state.
func HostIfName(network, containerID, ifname string) string {
	h := sha256.New()
	// NUL separators keep ("ab","c") and ("a","bc") apart; NUL cannot occur
	// in any of the three.
	h.Write([]byte(network))
	h.Write([]byte{0})
	h.Write([]byte(containerID))
	h.Write([]byte{0})
	h.Write([]byte(ifname))
	sum := h.Sum(nil)
	return HostIfPrefix + hex.EncodeToString(sum[:6])
}

// validIfName returns an error naming field if name is not an interface name
// the kernel accepts (dev_valid_name): 1-15 bytes, not "." or "..", no '/',
// ':', NUL or whitespace.
func validIfName(field, name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%s is empty", field)
	case len(name) > maxIfNameLen:
		return fmt.Errorf("%s %q is %d bytes long, the kernel allows at most %d", field, name, len(name), maxIfNameLen)
	case name == "." || name == "..":
		return fmt.Errorf("%s %q is not a valid interface name", field, name)
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c == '/' || c == ':' || c == 0 || isKernelSpace(c) {
			return fmt.Errorf("%s %q contains the invalid byte %#x at %d", field, name, c, i)
		}
	}
	return nil
}

// isKernelSpace mirrors the kernel's isspace(), which is Latin-1 aware and so
// also rejects 0xa0.
func isKernelSpace(c byte) bool {
	return c == ' ' || (c >= '\t' && c <= '\r') || c == 0xa0
}
