package bgp

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"

	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
)

// Defaults of the speaker and its sessions (what Calico and FRR use).
const (
	DefaultPort        = 179
	DefaultRestartTime = 120 * time.Second
	DefaultHoldTime    = 90 * time.Second
	DefaultMaxPrefixes = 10000
)

// Config is a validated BGPPeerPolicySpec (or --bgp-config file).
type Config struct {
	LocalASN uint32
	// ListenPort: 0 takes DefaultPort, -1 does not listen.
	ListenPort  int32
	RestartTime time.Duration
	Peers       []Peer
	// Services selects the Services whose addresses are announced (nil:
	// none).
	Services labels.Selector
	// AwaitEncrypted (WireGuard, set by the daemon, not by the spec): no
	// learned route is installed until SetEncrypted names the blocks the
	// tunnel carries, so none of them is ever routed in clear.
	AwaitEncrypted bool
}

// Peer is one validated neighbour.
type Peer struct {
	Address     netip.Addr
	ASN         uint32
	Port        uint16
	Password    Secret
	HoldTime    time.Duration
	Keepalive   time.Duration
	IPv4, IPv6  bool
	MaxPrefixes uint32
}

// Secret is a password that never prints: logs and errors show it redacted.
type Secret string

// String redacts.
func (Secret) String() string { return "(redacted)" }

// GoString redacts (%#v).
func (Secret) GoString() string { return "(redacted)" }

// MarshalText redacts (JSON, zap's reflection).
func (Secret) MarshalText() ([]byte, error) { return []byte("(redacted)"), nil }

// PasswordReader resolves a peer's password reference (a Secret key in
// Kubernetes mode, a file in the --bgp-config file).
type PasswordReader func(p coordinov1alpha1.BGPPeer) (string, error)

// FileConfig is the --bgp-config file: a BGPPeerPolicySpec (nodeSelector is
// ignored), passwords from passwordFile.
func FileConfig(path string) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("bgp-config: %w", err)
	}
	c, err := ParseFile(data, readPasswordFile)
	if err != nil {
		return Config{}, fmt.Errorf("bgp-config %s: %w", path, err)
	}
	return c, nil
}

// ParseFile parses a --bgp-config file's bytes (YAML or JSON).
func ParseFile(data []byte, pw PasswordReader) (Config, error) {
	var spec coordinov1alpha1.BGPPeerPolicySpec
	if err := yaml.UnmarshalStrict(data, &spec); err != nil {
		return Config{}, err
	}
	return FromSpec(spec, pw)
}

func readPasswordFile(p coordinov1alpha1.BGPPeer) (string, error) {
	if p.PasswordSecretRef != nil {
		return "", errors.New("passwordSecretRef: only in a BGPPeerPolicy; the file takes passwordFile")
	}
	if p.PasswordFile == "" {
		return "", nil
	}
	data, err := os.ReadFile(p.PasswordFile)
	if err != nil {
		return "", fmt.Errorf("passwordFile: %w", err)
	}
	return strings.TrimRight(string(data), "\r\n"), nil
}

// FromSpec validates spec; errors name the field. pw may be nil when no
// peer has a password.
func FromSpec(spec coordinov1alpha1.BGPPeerPolicySpec, pw PasswordReader) (Config, error) {
	c := Config{ListenPort: spec.ListenPort, RestartTime: time.Duration(spec.RestartTimeSeconds) * time.Second}
	asn, err := validASN(spec.LocalASN)
	if err != nil {
		return Config{}, fmt.Errorf("localASN: %w", err)
	}
	c.LocalASN = asn
	if c.ListenPort < -1 || c.ListenPort > 65535 {
		return Config{}, fmt.Errorf("listenPort %d: want -1..65535", c.ListenPort)
	}
	if c.ListenPort == 0 {
		c.ListenPort = DefaultPort
	}
	if spec.RestartTimeSeconds < 0 || spec.RestartTimeSeconds > 4095 {
		return Config{}, fmt.Errorf("restartTimeSeconds %d: want 0..4095 (RFC 4724's 12 bits)", spec.RestartTimeSeconds)
	}
	if c.RestartTime == 0 {
		c.RestartTime = DefaultRestartTime
	}
	if spec.ServiceSelector != nil {
		sel, err := metav1.LabelSelectorAsSelector(spec.ServiceSelector)
		if err != nil {
			return Config{}, fmt.Errorf("serviceSelector: %w", err)
		}
		c.Services = sel
	}
	if len(spec.Peers) == 0 {
		return Config{}, errors.New("peers: want at least one")
	}
	seen := map[netip.Addr]bool{}
	for i, sp := range spec.Peers {
		p, err := peerFromSpec(sp, pw)
		if err != nil {
			return Config{}, fmt.Errorf("peers[%d]: %w", i, err)
		}
		if seen[p.Address] {
			return Config{}, fmt.Errorf("peers[%d]: address %s listed twice", i, p.Address)
		}
		seen[p.Address] = true
		c.Peers = append(c.Peers, p)
	}
	return c, nil
}

func peerFromSpec(sp coordinov1alpha1.BGPPeer, pw PasswordReader) (Peer, error) {
	var p Peer
	a, err := netip.ParseAddr(sp.Address)
	if err != nil || a.Zone() != "" || a.IsUnspecified() || a.IsMulticast() {
		return p, fmt.Errorf("address %q: want a unicast IPv4 or IPv6 address", sp.Address)
	}
	p.Address = a.Unmap()
	if p.ASN, err = validASN(sp.ASN); err != nil {
		return p, fmt.Errorf("asn: %w", err)
	}
	switch {
	case sp.Port == 0:
		p.Port = DefaultPort
	case sp.Port < 1 || sp.Port > 65535:
		return p, fmt.Errorf("port %d: want 1..65535", sp.Port)
	default:
		p.Port = uint16(sp.Port)
	}
	p.HoldTime = DefaultHoldTime
	if sp.HoldTimeSeconds != 0 {
		if sp.HoldTimeSeconds < 3 || sp.HoldTimeSeconds > 65535 {
			return p, fmt.Errorf("holdTimeSeconds %d: want 3..65535", sp.HoldTimeSeconds)
		}
		p.HoldTime = time.Duration(sp.HoldTimeSeconds) * time.Second
	}
	p.Keepalive = p.HoldTime / 3
	if sp.KeepaliveSeconds != 0 {
		k := time.Duration(sp.KeepaliveSeconds) * time.Second
		if sp.KeepaliveSeconds < 1 || k > p.HoldTime/3 {
			return p, fmt.Errorf("keepaliveSeconds %d: want 1..a third of the hold time (%v)", sp.KeepaliveSeconds, p.HoldTime)
		}
		p.Keepalive = k
	}
	if len(sp.Families) == 0 {
		p.IPv4, p.IPv6 = true, true
	}
	for _, f := range sp.Families {
		switch f {
		case coordinov1alpha1.BGPFamilyIPv4:
			p.IPv4 = true
		case coordinov1alpha1.BGPFamilyIPv6:
			p.IPv6 = true
		default:
			return p, fmt.Errorf("families: %q, want %s or %s", f, coordinov1alpha1.BGPFamilyIPv4, coordinov1alpha1.BGPFamilyIPv6)
		}
	}
	p.MaxPrefixes = DefaultMaxPrefixes
	if sp.MaxPrefixes < 0 {
		return p, fmt.Errorf("maxPrefixes %d: want at least 1", sp.MaxPrefixes)
	}
	if sp.MaxPrefixes > 0 {
		p.MaxPrefixes = uint32(sp.MaxPrefixes)
	}
	if sp.PasswordSecretRef != nil || sp.PasswordFile != "" {
		if pw == nil {
			return p, errors.New("password: no way to read it here")
		}
		s, err := pw(sp)
		if err != nil {
			return p, err
		}
		// TCP_MD5SIG_MAXKEYLEN.
		if len(s) == 0 || len(s) > 80 {
			return p, fmt.Errorf("password: want 1..80 bytes, have %d", len(s))
		}
		p.Password = Secret(s)
	}
	return p, nil
}

func validASN(v int64) (uint32, error) {
	// 0 and 65535 / 4294967295 are reserved (RFC 7300); 23456 is AS_TRANS.
	if v < 1 || v > 4294967294 || v == 23456 || v == 65535 {
		return 0, fmt.Errorf("%d: want 1..4294967294, not 23456 or 65535", v)
	}
	return uint32(v), nil
}

// carries reports whether sessions to p carry the family.
func (p Peer) carries(v6 bool) bool {
	if v6 {
		return p.IPv6
	}
	return p.IPv4
}
