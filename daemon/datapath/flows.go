package datapath

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"sync"
	"time"

	"github.com/cilium/ebpf/ringbuf"
	"github.com/coordino/coordino/bpf"
	"golang.org/x/sys/unix"
)

// Flow is a new flow's verdict as reported by the datapath.
type Flow struct {
	Time           time.Time  `json:"time"`
	Endpoint       string     `json:"endpoint,omitempty"`
	IfIndex        uint32     `json:"ifindex"`
	Direction      string     `json:"direction"`
	Verdict        string     `json:"verdict"`
	Reason         string     `json:"reason"`
	Protocol       string     `json:"protocol"`
	Src            netip.Addr `json:"src"`
	Dst            netip.Addr `json:"dst"`
	SrcPort        uint16     `json:"srcPort,omitempty"`
	DstPort        uint16     `json:"dstPort,omitempty"`
	LocalIdentity  uint32     `json:"localIdentity"`
	RemoteIdentity uint32     `json:"remoteIdentity"`
}

var protoNames = map[uint8]string{1: "ICMP", 6: "TCP", 17: "UDP", 58: "ICMPv6", 132: "SCTP"}

// ProtocolName names an IP protocol number as flow events do ("TCP", or
// the number for one without a name).
func ProtocolName(p uint8) string {
	if n, ok := protoNames[p]; ok {
		return n
	}
	return fmt.Sprintf("%d", p)
}

// SetEmitAllowed chooses whether the datapath reports allowed new flows.
// Dropped and revoked flows are always reported. Reporting every allowed
// flow costs each new connection a ring-buffer write and, usually, a daemon
// wakeup competing with the traffic for CPU, so turn it on only while
// someone consumes those events. Counters are exact either way.
func (d *Datapath) SetEmitAllowed(on bool) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, err := d.mw.setCfgFlag(cfgEmitAllowed, on); err != nil {
		return fmt.Errorf("datapath: set flow event flags: %w", err)
	}
	return nil
}

// EmitAllowed reports whether allowed new flows are being reported.
func (d *Datapath) EmitAllowed() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.mw.hasCfgFlag(cfgEmitAllowed)
}

// cfgEmitAllowed is CFG_EMIT_ALLOWED of bpf/coordino.h (bpf2go does not
// export macros).
const cfgEmitAllowed = 1

// flowPollInterval bounds how late an allowed-flow event is delivered: the
// BPF programs submit those without waking the reader until the ring holds
// FLOW_WAKEUP_BYTES (bpf/coordino.c), so the reader also polls.
const flowPollInterval = 100 * time.Millisecond

// flowEventSize is the C struct flow_event without its tail padding.
const flowEventSize = 60

// ReadFlows delivers flow events to fn until ctx ends. The ring buffer has
// one consumer: run a single ReadFlows per datapath.
func (d *Datapath) ReadFlows(ctx context.Context, fn func(Flow)) error {
	rd, err := ringbuf.NewReader(d.objs.CdoFlows)
	if err != nil {
		return fmt.Errorf("datapath: open flow ring buffer: %w", err)
	}
	var once sync.Once
	closeRd := func() { once.Do(func() { rd.Close() }) }
	defer closeRd()
	stop := context.AfterFunc(ctx, closeRd)
	defer stop()
	// One record buffer for the reader's lifetime: no allocation per event.
	var rec ringbuf.Record
	rd.SetDeadline(time.Now().Add(flowPollInterval))
	for {
		if err := rd.ReadInto(&rec); err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				// Collect allowed-flow events submitted without a wakeup.
				rd.SetDeadline(time.Now().Add(flowPollInterval))
				continue
			}
			if errors.Is(err, ringbuf.ErrClosed) {
				return ctx.Err()
			}
			return fmt.Errorf("datapath: read flow event: %w", err)
		}
		var ev bpf.CoordinoFlowEvent
		if !parseFlowEvent(rec.RawSample, &ev) {
			continue
		}
		f := decodeFlow(&ev)
		f.Endpoint = d.att.endpointKey(ev.Ifindex)
		fn(f)
	}
}

// parseFlowEvent decodes a ring-buffer record by hand: unlike binary.Read
// it needs no reflection or allocation per event.
func parseFlowEvent(b []byte, ev *bpf.CoordinoFlowEvent) bool {
	if len(b) < flowEventSize {
		return false
	}
	le := binary.LittleEndian
	ev.TsNs = le.Uint64(b[0:])
	ev.Ifindex = le.Uint32(b[8:])
	ev.LocalId = le.Uint32(b[12:])
	ev.RemoteId = le.Uint32(b[16:])
	ev.Family, ev.Proto, ev.Dir, ev.Reason = b[20], b[21], b[22], b[23]
	ev.Sport = le.Uint16(b[24:])
	ev.Dport = le.Uint16(b[26:])
	copy(ev.Src[:], b[28:44])
	copy(ev.Dst[:], b[44:60])
	return true
}

// decodeFlow turns an event into a Flow; the caller names its endpoint.
func decodeFlow(ev *bpf.CoordinoFlowEvent) Flow {
	f := Flow{
		Time:           monoToWall(ev.TsNs),
		IfIndex:        ev.Ifindex,
		Direction:      "ingress",
		Verdict:        Verdict(ev.Reason),
		Reason:         ReasonName(ev.Reason),
		Protocol:       ProtocolName(ev.Proto),
		LocalIdentity:  ev.LocalId,
		RemoteIdentity: ev.RemoteId,
	}
	if ev.Dir == uint8(bpf.CoordinoDirectionDIR_EGRESS) {
		f.Direction = "egress"
	}
	if ev.Family == 4 {
		f.Src, f.Dst = netip.AddrFrom4([4]byte(ev.Src[:4])), netip.AddrFrom4([4]byte(ev.Dst[:4]))
	} else {
		f.Src, f.Dst = netip.AddrFrom16(ev.Src), netip.AddrFrom16(ev.Dst)
	}
	if ev.Proto == 6 || ev.Proto == 17 || ev.Proto == 132 {
		f.SrcPort, f.DstPort = ntohs(ev.Sport), ntohs(ev.Dport)
	}
	return f
}

// monoToWall converts a bpf_ktime_get_ns timestamp to wall-clock time.
func monoToWall(ns uint64) time.Time {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return time.Now()
	}
	return time.Now().Add(-time.Duration(uint64(ts.Nano()) - ns))
}

// JSONLines returns a ReadFlows callback writing one JSON object per line.
func JSONLines(w io.Writer) func(Flow) {
	enc := json.NewEncoder(w)
	var mu sync.Mutex
	return func(f Flow) {
		mu.Lock()
		defer mu.Unlock()
		_ = enc.Encode(f)
	}
}
