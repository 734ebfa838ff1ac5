package nftdp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/mdlayher/netlink"

	"github.com/coordino/coordino/daemon/identity"
	"github.com/coordino/coordino/daemon/policy"
)

// Flow events. The table's rules hand the packets to report to NFLOG
// group FlowLogGroup with a prefix saying why ("cdo egress policy-denied
// 300"); the daemon reads the group over netlink and turns each message
// into the flow event the eBPF datapath would have sent.

// FlowLogGroup is the NFLOG group the table logs flows to (one per
// network namespace; ulogd or nft monitor users pick other numbers).
const FlowLogGroup = 3085

// flowSnaplen is how much of each packet the kernel copies: an IPv6
// header with a few extension headers and the ports.
const flowSnaplen = 128

// Flow log rate limits, in packets per second (burst in packets). The
// drops are counted exactly whatever they are; only their events are
// limited, so a pod flooding denied packets costs the daemon at most
// dropLogNodeRate messages a second, and another pod's drops still get
// events: each endpoint's reason has its own limit below the node's.
const (
	dropLogEndpointRate  = 100
	dropLogEndpointBurst = 50
	dropLogNodeRate      = 1000
	dropLogNodeBurst     = 500
	// Allowed new flows, only while someone wants them, have their own
	// budget, so they never crowd out drop events.
	allowedLogNodeRate  = 10000
	allowedLogNodeBurst = 2000
)

// Names of the table's limit objects.
const (
	limitDropLog    = "flow-log-drops"
	limitAllowedLog = "flow-log-allowed"
)

// reasonAllowed marks the prefix of an allowed new flow: the daemon names
// its reason (policy, not-isolated, host) from the endpoint's state.
const reasonAllowed = "allowed"

// logPrefix is what a log rule tells about the packets it reports.
type logPrefix struct {
	dir    policy.Direction
	reason string
	// local is the endpoint's identity when the rule knows it (drop
	// rules, in the endpoint's chain); 0 for the allowed-flow rules.
	local identity.ID
}

func (p logPrefix) String() string {
	return fmt.Sprintf("cdo %s %s %d", directionName(p.dir), p.reason, p.local)
}

// directionName is the flow events' name of dir.
func directionName(dir policy.Direction) string {
	if dir == policy.Egress {
		return "egress"
	}
	return "ingress"
}

// parseLogPrefix reads back logPrefix.String.
func parseLogPrefix(s string) (logPrefix, bool) {
	f := strings.Fields(s)
	if len(f) != 4 || f[0] != "cdo" || f[2] == "" {
		return logPrefix{}, false
	}
	p := logPrefix{reason: f[2]}
	switch f[1] {
	case "ingress":
		p.dir = policy.Ingress
	case "egress":
		p.dir = policy.Egress
	default:
		return logPrefix{}, false
	}
	n, err := strconv.ParseUint(f[3], 10, 32)
	if err != nil {
		return logPrefix{}, false
	}
	p.local = identity.ID(n)
	return p, true
}

// nfnetlink_log's message types and attributes (linux/netfilter/nfnetlink_log.h).
const (
	nfnlSubsysULOG    = 4
	nfulnlMsgPacket   = 0
	nfulnlMsgConfig   = 1
	nfulaTimestamp    = 3
	nfulaIfIndexIn    = 4
	nfulaIfIndexOut   = 5
	nfulaPayload      = 9
	nfulaPrefix       = 10
	nfulaCfgCmd       = 1
	nfulaCfgMode      = 2
	nfulaCfgTimeout   = 4
	nfulaCfgQThresh   = 5
	nfulnlCfgBind     = 1
	nfulnlCfgUnbind   = 2
	nfulnlCopyPacket  = 2
	nfgenmsgLen       = 4
	nfnetlinkV0       = 0
	timestampAttrSize = 16
)

// logPacket is one NFLOG message.
type logPacket struct {
	prefix      string
	inIf, outIf uint32
	time        time.Time // zero when the packet carried no timestamp
	payload     []byte    // from the network header on
}

// parseLogMessage reads an NFULNL_MSG_PACKET message's data (after the
// netlink header). The kernel wrote it, but the payload is a pod's packet:
// nothing in it is trusted.
func parseLogMessage(b []byte) (logPacket, error) {
	var p logPacket
	if len(b) < nfgenmsgLen {
		return p, errors.New("nflog message shorter than its nfgenmsg header")
	}
	ad, err := netlink.NewAttributeDecoder(b[nfgenmsgLen:])
	if err != nil {
		return p, fmt.Errorf("nflog message: %w", err)
	}
	ad.ByteOrder = binary.BigEndian
	for ad.Next() {
		switch ad.Type() {
		case nfulaPrefix:
			p.prefix = strings.TrimRight(ad.String(), "\x00")
		case nfulaIfIndexIn:
			p.inIf = ad.Uint32()
		case nfulaIfIndexOut:
			p.outIf = ad.Uint32()
		case nfulaPayload:
			p.payload = ad.Bytes()
		case nfulaTimestamp:
			if ts := ad.Bytes(); len(ts) == timestampAttrSize {
				sec, usec := binary.BigEndian.Uint64(ts), binary.BigEndian.Uint64(ts[8:])
				if sec < 1<<40 && usec < 1e6 {
					p.time = time.Unix(int64(sec), int64(usec)*1000)
				}
			}
		}
	}
	if err := ad.Err(); err != nil {
		return p, fmt.Errorf("nflog message: %w", err)
	}
	return p, nil
}

// packetHeader is what a flow event tells of a packet.
type packetHeader struct {
	proto        uint8
	src, dst     netip.Addr
	sport, dport uint16
}

// IPv6 extension headers skipped to find the transport header.
const (
	ipv6HopByHop = 0
	ipv6Routing  = 43
	ipv6Fragment = 44
	ipv6DestOpts = 60
)

// parsePacketHeader reads the addresses, protocol and ports of an IP
// packet; ports only for TCP, UDP and SCTP in a first (or only) fragment.
func parsePacketHeader(b []byte) (packetHeader, bool) {
	var h packetHeader
	if len(b) < 1 {
		return h, false
	}
	var l4 []byte
	switch b[0] >> 4 {
	case 4:
		ihl := int(b[0]&0x0f) * 4
		if len(b) < 20 || ihl < 20 || len(b) < ihl {
			return h, false
		}
		h.proto = b[9]
		h.src, h.dst = netip.AddrFrom4([4]byte(b[12:16])), netip.AddrFrom4([4]byte(b[16:20]))
		if binary.BigEndian.Uint16(b[6:8])&0x1fff == 0 {
			l4 = b[ihl:]
		}
	case 6:
		if len(b) < 40 {
			return h, false
		}
		h.src, h.dst = netip.AddrFrom16([16]byte(b[8:24])), netip.AddrFrom16([16]byte(b[24:40]))
		next, rest := b[6], b[40:]
		// A bounded walk: at most a few extension headers fit the snap length.
	walk:
		for range 8 {
			switch next {
			case ipv6HopByHop, ipv6Routing, ipv6DestOpts:
				if len(rest) < 8 || len(rest) < (int(rest[1])+1)*8 {
					break walk
				}
				next, rest = rest[0], rest[(int(rest[1])+1)*8:]
			case ipv6Fragment:
				if len(rest) < 8 {
					break walk
				}
				later := binary.BigEndian.Uint16(rest[2:4])&0xfff8 != 0
				next, rest = rest[0], rest[8:]
				if later {
					h.proto = next
					return h, true
				}
			default:
				break walk
			}
		}
		h.proto, l4 = next, rest
	default:
		return h, false
	}
	if portProto(h.proto) && len(l4) >= 4 {
		h.sport, h.dport = binary.BigEndian.Uint16(l4[0:2]), binary.BigEndian.Uint16(l4[2:4])
	}
	return h, true
}

func portProto(p uint8) bool {
	return p == policy.ProtoTCP || p == policy.ProtoUDP || p == policy.ProtoSCTP
}
