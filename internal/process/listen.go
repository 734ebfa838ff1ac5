package process

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
)

// UnixPrefix marks a metrics address that is a Unix socket path
// ("unix:/run/coordino/metrics.sock") instead of host:port.
const UnixPrefix = "unix:"

// ValidateAddr checks a --metrics-addr value: host:port, or UnixPrefix
// followed by an absolute path.
func ValidateAddr(addr string) error {
	if path, ok := strings.CutPrefix(addr, UnixPrefix); ok {
		if !filepath.IsAbs(path) {
			return fmt.Errorf("metrics-addr %q: the socket path must be absolute", addr)
		}
		return nil
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return fmt.Errorf("metrics-addr %q: want host:port or unix:/path: %w", addr, err)
	}
	return nil
}

// AddrString renders a listener address the way --metrics-addr takes it.
func AddrString(a net.Addr) string {
	if a.Network() == "unix" {
		return UnixPrefix + a.String()
	}
	return a.String()
}

// listen opens the metrics listener. A Unix socket is made 0600, so only
// root (a node-local scraper or proxy running as root) can read it; a stale
// socket from a previous run is replaced, any other file is not.
func listen(addr string) (net.Listener, error) {
	path, ok := strings.CutPrefix(addr, UnixPrefix)
	if !ok {
		return net.Listen("tcp", addr)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != fs.ModeSocket {
			return nil, fmt.Errorf("%s exists and is not a socket", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, err
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, err
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}
