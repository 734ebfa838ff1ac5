package datapath

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
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
	for {
		rec, err := rd.Read()
		if err != nil {
			if errors.Is(err, ringbuf.ErrClosed) {
				return ctx.Err()
			}
			return fmt.Errorf("datapath: read flow event: %w", err)
		}
		var ev bpf.CoordinoFlowEvent
		if err := binary.Read(bytes.NewReader(rec.RawSample), binary.LittleEndian, &ev); err != nil {
			continue
		}
		fn(d.decodeFlow(&ev))
	}
}

func (d *Datapath) decodeFlow(ev *bpf.CoordinoFlowEvent) Flow {
	f := Flow{
		Time:           monoToWall(ev.TsNs),
		IfIndex:        ev.Ifindex,
		Direction:      "ingress",
		Verdict:        Verdict(ev.Reason),
		Reason:         ReasonName(ev.Reason),
		Protocol:       protoNames[ev.Proto],
		LocalIdentity:  ev.LocalId,
		RemoteIdentity: ev.RemoteId,
	}
	if ev.Dir == uint8(bpf.CoordinoDirectionDIR_EGRESS) {
		f.Direction = "egress"
	}
	if f.Protocol == "" {
		f.Protocol = fmt.Sprintf("%d", ev.Proto)
	}
	if ev.Family == 4 {
		f.Src, f.Dst = netip.AddrFrom4([4]byte(ev.Src[:4])), netip.AddrFrom4([4]byte(ev.Dst[:4]))
	} else {
		f.Src, f.Dst = netip.AddrFrom16(ev.Src), netip.AddrFrom16(ev.Dst)
	}
	if ev.Proto == 6 || ev.Proto == 17 || ev.Proto == 132 {
		f.SrcPort, f.DstPort = ntohs(ev.Sport), ntohs(ev.Dport)
	}
	d.mu.Lock()
	for _, r := range d.eps {
		if uint32(r.HostIfIndex) == ev.Ifindex {
			f.Endpoint = r.Key
			break
		}
	}
	d.mu.Unlock()
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
