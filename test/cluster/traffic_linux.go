package cluster

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netns"
)

// Traffic is long-lived pod-to-pod traffic driven from the test process
// through the pods' own network namespaces: TCP connections that echo a
// counter every 50 ms, UDP streams of a datagram every 20 ms, and probes
// from pods the policy denies (a new TCP connection every 100 ms, UDP
// datagrams from a fixed and from a new socket). It records resets, the
// longest silence of each flow, and every denied probe that got through.
// The make e2e-upgrade measure of an upgrade's cost to traffic.
type Traffic struct {
	TCPPort, UDPPort int

	mu       sync.Mutex
	flows    map[string]*flowStat // "tcp 10.234.1.5->10.234.2.7"
	denied   map[netip.Addr]bool
	through  []string // denied probes that arrived
	accepted int      // connections from allowed pods (the clients' and later ones')
	stop     chan struct{}
	wg       sync.WaitGroup
	closers  []func()
}

type flowStat struct {
	last    time.Time
	maxGap  time.Duration
	gapAt   time.Time
	long    []Silence // every silence over noticeableGap
	packets int
	err     error
}

// NewTraffic starts no traffic yet; Serve, Flow and Probe add it.
func NewTraffic(tcpPort, udpPort int) *Traffic {
	return &Traffic{TCPPort: tcpPort, UDPPort: udpPort, flows: map[string]*flowStat{},
		denied: map[netip.Addr]bool{}, stop: make(chan struct{})}
}

// Deny names a pod address whose packets must never reach a server.
func (tr *Traffic) Deny(a netip.Addr) {
	tr.mu.Lock()
	tr.denied[a] = true
	tr.mu.Unlock()
}

// Serve listens on the TCP and UDP ports in ns (a server pod's namespace):
// TCP connections are echoed, UDP datagrams timed per source.
func (tr *Traffic) Serve(ns netns.NsHandle) error {
	var ln net.Listener
	var pc net.PacketConn
	err := inNetns(ns, func() error {
		var err error
		if ln, err = net.Listen("tcp", fmt.Sprintf(":%d", tr.TCPPort)); err != nil {
			return err
		}
		pc, err = net.ListenPacket("udp", fmt.Sprintf(":%d", tr.UDPPort))
		return err
	})
	if err != nil {
		if ln != nil {
			ln.Close()
		}
		return fmt.Errorf("serve traffic: %w", err)
	}
	tr.onStop(func() { ln.Close() }, func() { pc.Close() })
	tr.wg.Add(2)
	go func() {
		defer tr.wg.Done()
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			src := addrOf(conn.RemoteAddr())
			tr.mu.Lock()
			if tr.denied[src] {
				tr.through = append(tr.through, fmt.Sprintf("%s tcp %s->%s", time.Now().Format(time.StampMilli), conn.RemoteAddr(), conn.LocalAddr()))
				tr.mu.Unlock()
				conn.Close()
				continue
			}
			tr.accepted++
			tr.closers = append(tr.closers, func() { conn.Close() })
			tr.mu.Unlock()
			go func() {
				defer conn.Close()
				buf := make([]byte, 8)
				for {
					if _, err := readFull(conn, buf); err != nil {
						return
					}
					if _, err := conn.Write(buf); err != nil {
						return
					}
				}
			}()
		}
	}()
	go func() {
		defer tr.wg.Done()
		buf := make([]byte, 64)
		for {
			_, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			src := addrOf(from)
			now := time.Now()
			tr.mu.Lock()
			if tr.denied[src] {
				tr.through = append(tr.through, fmt.Sprintf("%s udp %s->%s", now.Format(time.StampMilli), from, pc.LocalAddr()))
			} else {
				key := "udp " + from.String() + "->" + pc.LocalAddr().String()
				tr.flow(key).seen(now)
			}
			tr.mu.Unlock()
		}
	}()
	return nil
}

func (tr *Traffic) onStop(fs ...func()) {
	tr.mu.Lock()
	tr.closers = append(tr.closers, fs...)
	tr.mu.Unlock()
}

func addrOf(a net.Addr) netip.Addr {
	ap, _ := netip.ParseAddrPort(a.String())
	return ap.Addr().Unmap()
}

func readFull(c net.Conn, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		m, err := c.Read(b[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

func (tr *Traffic) flow(key string) *flowStat {
	f := tr.flows[key]
	if f == nil {
		f = &flowStat{}
		tr.flows[key] = f
	}
	return f
}

func (f *flowStat) seen(now time.Time) {
	if !f.last.IsZero() {
		g := now.Sub(f.last)
		if g > f.maxGap {
			f.maxGap, f.gapAt = g, now
		}
		if g > noticeableGap {
			f.long = append(f.long, Silence{Len: g, End: now})
		}
	}
	f.last = now
	f.packets++
}

// Flow starts, from ns (a client pod's namespace), one TCP connection and
// one UDP stream to server.
func (tr *Traffic) Flow(ns netns.NsHandle, server netip.Addr) error {
	var conn net.Conn
	var uc net.Conn
	err := inNetns(ns, func() error {
		var err error
		if conn, err = net.DialTimeout("tcp", netip.AddrPortFrom(server, uint16(tr.TCPPort)).String(), 5*time.Second); err != nil {
			return err
		}
		uc, err = net.Dial("udp", netip.AddrPortFrom(server, uint16(tr.UDPPort)).String())
		return err
	})
	if err != nil {
		if conn != nil {
			conn.Close()
		}
		return fmt.Errorf("flow to %s: %w", server, err)
	}
	tr.onStop(func() { conn.Close() }, func() { uc.Close() })
	key := "tcp " + conn.LocalAddr().String() + "->" + conn.RemoteAddr().String()
	tr.wg.Add(2)
	go func() {
		defer tr.wg.Done()
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		buf := make([]byte, 8)
		for i := uint64(0); ; i++ {
			select {
			case <-tr.stop:
				return
			case <-tick.C:
			}
			binary.BigEndian.PutUint64(buf, i)
			_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
			_, err := conn.Write(buf)
			if err == nil {
				_, err = readFull(conn, buf)
			}
			if err == nil && binary.BigEndian.Uint64(buf) != i {
				err = fmt.Errorf("echo %d, want %d", binary.BigEndian.Uint64(buf), i)
			}
			now := time.Now()
			tr.mu.Lock()
			f := tr.flow(key)
			if err != nil {
				select {
				case <-tr.stop: // closed by Stop
				default:
					f.err = fmt.Errorf("%s: %w", now.Format(time.StampMilli), err)
				}
				tr.mu.Unlock()
				return
			}
			f.seen(now)
			tr.mu.Unlock()
		}
	}()
	go func() {
		defer tr.wg.Done()
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-tr.stop:
				return
			case <-tick.C:
			}
			_, _ = uc.Write([]byte("upgrade"))
		}
	}()
	return nil
}

// Probe sends, from ns (a pod the policy denies), new TCP connections and
// UDP datagrams to server without pause until Stop.
func (tr *Traffic) Probe(ns netns.NsHandle, server netip.Addr) {
	tcp := netip.AddrPortFrom(server, uint16(tr.TCPPort)).String()
	udp := netip.AddrPortFrom(server, uint16(tr.UDPPort)).String()
	tr.wg.Add(1)
	go func() {
		defer tr.wg.Done()
		var fixed net.Conn
		for i := 0; ; i++ {
			select {
			case <-tr.stop:
				if fixed != nil {
					fixed.Close()
				}
				return
			case <-time.After(20 * time.Millisecond):
			}
			_ = inNetns(ns, func() error {
				if fixed == nil {
					fixed, _ = net.Dial("udp", udp)
				}
				if i%50 == 0 { // a new flow each second
					if c, err := net.Dial("udp", udp); err == nil {
						_, _ = c.Write([]byte("denied"))
						c.Close()
					}
				}
				if i%5 == 0 {
					if c, err := net.DialTimeout("tcp", tcp, 200*time.Millisecond); err == nil {
						c.Close() // Serve records it
					}
				}
				return nil
			})
			if fixed != nil {
				_, _ = fixed.Write([]byte("denied"))
			}
		}
	}()
}

// Stop ends the traffic; Report then reads the final figures.
func (tr *Traffic) Stop() {
	close(tr.stop)
	tr.mu.Lock()
	closers := tr.closers
	tr.mu.Unlock()
	for _, c := range closers {
		c()
	}
	tr.wg.Wait()
}

// TrafficReport is what the traffic saw so far.
type TrafficReport struct {
	Flows    int
	Resets   []string      // flows that ended in an error
	MaxGap   time.Duration // the longest silence of any flow
	GapFlow  string        // and which flow, when
	Through  []string      // denied probes that arrived
	Silent   []string      // flows that never passed a packet
	Accepted int           // TCP connections accepted from allowed pods
	// Silences are every ended silence of a flow over noticeableGap, in
	// the order they ended: which step of a roll each belongs to.
	Silences []Silence
}

// noticeableGap is the shortest silence a report lists one by one: ten
// of the flows' slowest beats (a TCP echo every 50 ms).
const noticeableGap = 500 * time.Millisecond

// Silence is one flow's silence, ended at End.
type Silence struct {
	Flow string
	Len  time.Duration
	End  time.Time
}

func (s Silence) String() string {
	return fmt.Sprintf("%s silent %s ending %s", s.Flow, s.Len.Round(time.Millisecond), s.End.Format(time.StampMilli))
}

// Report reads the figures, counting a live flow's silence up to now.
func (tr *Traffic) Report() TrafficReport {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	now := time.Now()
	r := TrafficReport{Flows: len(tr.flows), Through: append([]string(nil), tr.through...), Accepted: tr.accepted}
	for key, f := range tr.flows {
		if f.err != nil {
			r.Resets = append(r.Resets, key+": "+f.err.Error())
			continue
		}
		if f.packets == 0 {
			r.Silent = append(r.Silent, key)
			continue
		}
		for _, l := range f.long {
			l.Flow = key
			r.Silences = append(r.Silences, l)
		}
		gap, at := f.maxGap, f.gapAt
		if g := now.Sub(f.last); g > gap {
			gap, at = g, now
		}
		if gap > r.MaxGap {
			r.MaxGap, r.GapFlow = gap, key+" ending "+at.Format(time.StampMilli)
		}
	}
	sort.Strings(r.Resets)
	sort.Slice(r.Silences, func(i, j int) bool { return r.Silences[i].End.Before(r.Silences[j].End) })
	return r
}

// Problems lists what breaks the upgrade's promises: a reset, a silence
// over maxGap, a denied probe through.
func (r TrafficReport) Problems(maxGap time.Duration) error {
	var p []string
	if len(r.Resets) > 0 {
		p = append(p, fmt.Sprintf("%d connections reset: %s", len(r.Resets), strings.Join(r.Resets, "; ")))
	}
	if r.MaxGap > maxGap {
		p = append(p, fmt.Sprintf("a flow was silent %s (over %s): %s", r.MaxGap.Round(time.Millisecond), maxGap, r.GapFlow))
	}
	if len(r.Through) > 0 {
		p = append(p, fmt.Sprintf("%d denied probes got through: %s", len(r.Through), strings.Join(first(r.Through, 5), "; ")))
	}
	if len(p) == 0 {
		return nil
	}
	return errors.New(strings.Join(p, "; "))
}

func first(s []string, n int) []string {
	if len(s) > n {
		return s[:n]
	}
	return s
}
