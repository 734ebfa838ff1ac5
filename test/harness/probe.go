package harness

import (
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"
)

// Probe is one connectivity check: a TCP connect or a UDP echo round trip
// from a socket created in From to To:Port.
type Probe struct {
	From  ns.NetNS
	To    netip.Addr
	Port  int
	Proto string // "tcp" or "udp"
	// SourcePort, when set, is the port the probe sends from (else the
	// kernel picks one): a flow on the ports of an earlier one.
	SourcePort int
}

// Outcome of a probe.
type Outcome int

// Outcomes: Reached means the handshake or echo completed; Blocked means
// nothing came back before the timeout (a dropped packet); Refused means an
// RST or ICMP unreachable came back; Failed is any other socket error.
const (
	Reached Outcome = iota
	Blocked
	Refused
	Failed
)

func (o Outcome) String() string {
	switch o {
	case Reached:
		return "reached"
	case Blocked:
		return "blocked"
	case Refused:
		return "refused"
	}
	return "failed"
}

// ProbeAll runs every probe at once and waits at most timeout for all of
// them. Sockets are created (and connected) inside their source netns, then
// a single poll loop in this goroutine waits for all of them: hundreds of
// probes cost one timeout, with no thread per probe.
func ProbeAll(probes []Probe, timeout time.Duration) ([]Outcome, error) {
	out := make([]Outcome, len(probes))
	fds := make([]int, len(probes))
	for i := range fds {
		fds[i] = -1
	}
	defer func() {
		for _, fd := range fds {
			if fd >= 0 {
				_ = unix.Close(fd)
			}
		}
	}()
	token := make([]byte, 16)
	_, _ = rand.Read(token)

	// One netns switch per distinct source.
	bySource := map[ns.NetNS][]int{}
	var order []ns.NetNS
	for i, p := range probes {
		if _, ok := bySource[p.From]; !ok {
			order = append(order, p.From)
		}
		bySource[p.From] = append(bySource[p.From], i)
	}
	start := time.Now()
	for _, src := range order {
		if err := src.Do(func(ns.NetNS) error {
			for _, i := range bySource[src] {
				fd, err := openProbe(probes[i], token)
				if err != nil {
					return fmt.Errorf("probe %s %v:%d: %w", probes[i].Proto, probes[i].To, probes[i].Port, err)
				}
				fds[i] = fd
			}
			return nil
		}); err != nil {
			return nil, err
		}
	}

	pfds := make([]unix.PollFd, len(probes))
	pending := len(probes)
	for i, p := range probes {
		out[i] = Blocked
		ev := int16(unix.POLLOUT)
		if p.Proto == "udp" {
			ev = unix.POLLIN
		}
		pfds[i] = unix.PollFd{Fd: int32(fds[i]), Events: ev}
	}
	deadline := start.Add(timeout)
	buf := make([]byte, 64)
	for pending > 0 {
		left := time.Until(deadline)
		if left <= 0 {
			break
		}
		n, err := unix.Poll(pfds, int(left.Milliseconds())+1)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("poll: %w", err)
		}
		if n == 0 {
			continue
		}
		for i := range pfds {
			if pfds[i].Fd < 0 || pfds[i].Revents == 0 {
				continue
			}
			if probes[i].Proto == "udp" {
				m, rerr := unix.Read(fds[i], buf)
				switch {
				case errors.Is(rerr, unix.EAGAIN):
					continue // spurious wake-up
				case rerr == nil && string(buf[:m]) == string(token):
					out[i] = Reached
				default:
					out[i] = classify(rerr)
				}
			} else {
				soerr, gerr := unix.GetsockoptInt(fds[i], unix.SOL_SOCKET, unix.SO_ERROR)
				if gerr != nil {
					out[i] = Failed
				} else {
					out[i] = classify(unix.Errno(soerr))
				}
			}
			pfds[i].Fd = -1 // poll ignores negative fds
			pending--
		}
	}
	return out, nil
}

func classify(err error) Outcome {
	var errno unix.Errno
	switch {
	case err == nil, errors.As(err, &errno) && errno == 0:
		return Reached
	case errors.Is(err, unix.ECONNREFUSED):
		return Refused
	}
	return Failed
}

// openProbe creates a non-blocking socket in the current netns and starts
// the probe: a TCP connect, or a UDP send of token on a connected socket
// (so only the peer's reply, or its ICMP error, is received).
func openProbe(p Probe, token []byte) (int, error) {
	family := unix.AF_INET6
	var sa unix.Sockaddr = &unix.SockaddrInet6{Port: p.Port, Addr: p.To.As16()}
	if p.To.Is4() {
		family = unix.AF_INET
		sa = &unix.SockaddrInet4{Port: p.Port, Addr: p.To.As4()}
	}
	typ := unix.SOCK_STREAM
	if p.Proto == "udp" {
		typ = unix.SOCK_DGRAM
	} else if p.Proto != "tcp" {
		return -1, fmt.Errorf("unknown protocol %q", p.Proto)
	}
	fd, err := unix.Socket(family, typ|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	if typ == unix.SOCK_STREAM {
		// Close with RST: thousands of probes leave no TIME_WAIT behind.
		_ = unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 0})
	}
	if p.SourcePort != 0 {
		var local unix.Sockaddr = &unix.SockaddrInet6{Port: p.SourcePort}
		if family == unix.AF_INET {
			local = &unix.SockaddrInet4{Port: p.SourcePort}
		}
		if err := unix.Bind(fd, local); err != nil {
			unix.Close(fd)
			return -1, fmt.Errorf("bind source port %d: %w", p.SourcePort, err)
		}
	}
	err = unix.Connect(fd, sa)
	if typ == unix.SOCK_STREAM && errors.Is(err, unix.EINPROGRESS) {
		err = nil
	}
	if err == nil && typ == unix.SOCK_DGRAM {
		_, err = unix.Write(fd, token)
	}
	if err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// ServeUDPEcho answers every datagram on addr:port inside netns with the
// same bytes. It returns a stop function.
func ServeUDPEcho(netns ns.NetNS, addr netip.Addr, port int) (stop func(), err error) {
	var c net.PacketConn
	if err := netns.Do(func(ns.NetNS) error {
		var lerr error
		c, lerr = net.ListenPacket("udp", netip.AddrPortFrom(addr, uint16(port)).String())
		return lerr
	}); err != nil {
		return nil, fmt.Errorf("listen udp on %v:%d: %w", addr, port, err)
	}
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := c.ReadFrom(buf)
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				continue
			}
			_, _ = c.WriteTo(buf[:n], from)
		}
	}()
	return func() { c.Close() }, nil
}

// ServeTCPEcho accepts TCP connections on addr:port inside netns and echoes
// each one until the peer closes: a long-lived connection for tests that
// watch a flow across restarts and policy changes.
func ServeTCPEcho(netns ns.NetNS, addr netip.Addr, port int) (stop func(), err error) {
	return ServeTCP(netns, netip.AddrPortFrom(addr, uint16(port)), func(c net.Conn) {
		buf := make([]byte, 64<<10)
		for {
			n, err := c.Read(buf)
			if err != nil {
				return
			}
			if _, err := c.Write(buf[:n]); err != nil {
				return
			}
		}
	})
}

// ServeTCP accepts TCP connections on at inside netns (an unspecified
// address listens on every address of both families) and runs handle on
// each, closing it when handle returns. stop closes the listener and every
// open connection.
func ServeTCP(netns ns.NetNS, at netip.AddrPort, handle func(net.Conn)) (stop func(), err error) {
	var l net.Listener
	if err := netns.Do(func(ns.NetNS) error {
		addr := at.String()
		if !at.Addr().IsValid() || at.Addr().IsUnspecified() {
			addr = fmt.Sprintf(":%d", at.Port())
		}
		var lerr error
		l, lerr = net.Listen("tcp", addr)
		return lerr
	}); err != nil {
		return nil, fmt.Errorf("listen tcp on %v: %w", at, err)
	}
	var (
		mu    sync.Mutex
		conns = map[net.Conn]bool{}
	)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns[c] = true
			mu.Unlock()
			go func() {
				defer func() { mu.Lock(); delete(conns, c); mu.Unlock(); c.Close() }()
				handle(c)
			}()
		}
	}()
	return func() {
		l.Close()
		mu.Lock()
		defer mu.Unlock()
		for c := range conns {
			c.Close()
		}
	}, nil
}

// DialFrom opens a TCP or UDP connection from inside netns (the socket
// stays in that netns whatever thread uses it later).
func DialFrom(netns ns.NetNS, proto string, addr netip.Addr, port int, timeout time.Duration) (net.Conn, error) {
	var c net.Conn
	err := netns.Do(func(ns.NetNS) error {
		var derr error
		c, derr = net.DialTimeout(proto, netip.AddrPortFrom(addr, uint16(port)).String(), timeout)
		return derr
	})
	return c, err
}
