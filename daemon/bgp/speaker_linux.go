package bgp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/apiutil"
	"github.com/osrg/gobgp/v4/pkg/packet/bgp"
	"github.com/osrg/gobgp/v4/pkg/server"
	"github.com/vishvananda/netlink"
	"go.uber.org/zap"
	"go.uber.org/zap/exp/zapslog"
	"golang.org/x/sys/unix"

	"github.com/coordino/coordino/daemon/routing"
)

// RouteProtocol marks the kernel routes learned over BGP (rtm_protocol),
// apart from the other routing modes' (routing.RouteProtocol).
const RouteProtocol netlink.RouteProtocol = 0xc6

// startedFile, in the state dir, records that a speaker ran on this node:
// the next start is a graceful restart.
const startedFile = "bgp.started"

// settle batches bursts of BGP updates into one kernel sync.
const settle = 50 * time.Millisecond

// Speaker is the node's BGP speaker and the kernel routes it installs.
type Speaker struct {
	cfg      Config
	self     string
	stateDir string
	log      *zap.Logger
	srv      *server.BgpServer

	kick chan struct{}
	gr   *api.GracefulRestart
	// restarting: routes installed by the previous run are kept (not
	// pruned) until every peer has re-sent its table or the restart
	// time has passed.
	restartDeadline time.Time

	mu        sync.Mutex
	guard     Guard
	announced map[netip.Prefix]*apiutil.Path
	// serviceRoutes are the Service addresses announced beside the
	// blocks (SetServices).
	serviceRoutes []netip.Prefix
	eor           map[netip.Addr]map[bgp.Family]bool
	rejected      map[netip.Prefix]string
	// downReason is why each session last left Established or failed to
	// reach it (GoBGP's list of peers keeps it only for some reasons).
	downReason map[netip.Addr]string
	installed  int
	pruning    bool
	// left: the node left the fabric (Leave); nothing is installed any
	// more. syncMu orders a kernel sync and Leave's removal.
	left   bool
	syncMu sync.Mutex
	// awaitEncrypted: Config.AwaitEncrypted until SetEncrypted.
	awaitEncrypted bool
}

// Start runs a speaker for the node self with cfg; stateDir keeps the
// marker that makes the next start a graceful restart. The routes of a
// previous run stay in the kernel.
func Start(ctx context.Context, cfg Config, self, stateDir string, routerID netip.Addr, log *zap.Logger) (*Speaker, error) {
	if !routerID.Is4() {
		return nil, fmt.Errorf("bgp: router ID %v: the node needs an IPv4 address (or set one)", routerID)
	}
	s := &Speaker{
		cfg: cfg, self: self, stateDir: stateDir, log: log.Named("bgp"), awaitEncrypted: cfg.AwaitEncrypted,
		kick: make(chan struct{}, 1), announced: map[netip.Prefix]*apiutil.Path{},
		eor: map[netip.Addr]map[bgp.Family]bool{}, rejected: map[netip.Prefix]string{},
		downReason: map[netip.Addr]string{},
	}
	// The state dir may not exist yet on a node's first start; without it
	// the marker is lost and every restart would prune at once.
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return nil, fmt.Errorf("bgp: state dir %s: %w", stateDir, err)
	}
	marker := filepath.Join(stateDir, startedFile)
	_, err := os.Stat(marker)
	restarting := err == nil
	if restarting {
		s.restartDeadline = time.Now().Add(cfg.RestartTime)
	} else {
		s.pruning = true
	}
	// GoBGP logs through zap at warn and above: its info lines are per
	// message, and none of them carries the MD5 password (gobgp never
	// logs PeerConf.AuthPassword).
	lvl := new(slog.LevelVar)
	lvl.Set(slog.LevelWarn)
	s.srv = server.NewBgpServer(server.LoggerOption(slog.New(zapslog.NewHandler(s.log.Named("gobgp").Core())), lvl))
	go s.srv.Serve()
	// No N-bit (RFC 8538, NotificationEnabled): a session that ends with a
	// NOTIFICATION, such as a peer's hold-timer expiry when this node lost
	// power, is then no restart, and the peers withdraw its routes within
	// the hold time instead of keeping them for the restart time too.
	gr := &api.GracefulRestart{Enabled: true, RestartTime: uint32(cfg.RestartTime / time.Second), DeferralTime: uint32(cfg.RestartTime / time.Second), NotificationEnabled: false}
	s.gr = gr
	if err := s.srv.StartBgp(ctx, &api.StartBgpRequest{Global: &api.Global{
		Asn: cfg.LocalASN, RouterId: routerID.String(), ListenPort: cfg.ListenPort, GracefulRestart: gr,
	}}); err != nil {
		s.srv.Stop()
		return nil, fmt.Errorf("bgp: start speaker (ASN %d, port %d): %w", cfg.LocalASN, cfg.ListenPort, err)
	}
	if err := s.srv.WatchEvent(ctx, server.WatchEventMessageCallbacks{
		OnBestPath:   func([]*apiutil.Path, time.Time) { s.poke() },
		OnPathEor:    func(p *apiutil.Path, _ time.Time) { s.endOfRIB(p) },
		OnPeerUpdate: func(ev *apiutil.WatchEventMessage_PeerEvent, _ time.Time) { s.peerEvent(ev) },
	}, server.WatchBestPath(true), server.WatchEor(true), server.WatchPeer()); err != nil {
		s.srv.Stop()
		return nil, fmt.Errorf("bgp: watch: %w", err)
	}
	for _, p := range cfg.Peers {
		if err := s.addPeer(ctx, p, restarting); err != nil {
			s.srv.Stop()
			return nil, err
		}
	}
	if err := os.WriteFile(marker, nil, 0o600); err != nil {
		s.log.Warn("graceful-restart marker not written: the next start prunes at once", zap.Error(err))
	}
	s.log.Info("speaker started", zap.Uint32("asn", cfg.LocalASN), zap.Stringer("routerID", routerID),
		zap.Bool("gracefulRestart", restarting), zap.Duration("restartTime", cfg.RestartTime))
	go s.run(ctx)
	return s, nil
}

func (s *Speaker) addPeer(ctx context.Context, p Peer, restarting bool) error {
	if err := s.srv.AddPeer(ctx, &api.AddPeerRequest{Peer: peerRequest(p, s.gr, restarting)}); err != nil {
		return fmt.Errorf("bgp: peer %s (ASN %d): %w", p.Address, p.ASN, err)
	}
	s.eor[p.Address] = map[bgp.Family]bool{}
	s.log.Info("peer configured", zap.Stringer("peer", p.Address), zap.Uint32("asn", p.ASN), zap.Uint16("port", p.Port),
		zap.Bool("md5", p.Password != ""), zap.Duration("hold", p.HoldTime), zap.Bool("ipv4", p.IPv4), zap.Bool("ipv6", p.IPv6))
	return nil
}

// Configure applies a changed configuration to the running speaker: peers
// that left are removed (their routes with them), new ones added, changed
// ones re-created. The local ASN, listen port and restart time are the
// speaker's identity: changing them needs a daemon restart, and Configure
// refuses, naming the field.
func (s *Speaker) Configure(ctx context.Context, cfg Config) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case cfg.LocalASN != s.cfg.LocalASN:
		return fmt.Errorf("bgp: localASN %d -> %d: takes effect at the daemon's next start", s.cfg.LocalASN, cfg.LocalASN)
	case cfg.ListenPort != s.cfg.ListenPort:
		return fmt.Errorf("bgp: listenPort %d -> %d: takes effect at the daemon's next start", s.cfg.ListenPort, cfg.ListenPort)
	case cfg.RestartTime != s.cfg.RestartTime:
		return fmt.Errorf("bgp: restartTimeSeconds %v -> %v: takes effect at the daemon's next start", s.cfg.RestartTime, cfg.RestartTime)
	}
	want := map[netip.Addr]Peer{}
	for _, p := range cfg.Peers {
		want[p.Address] = p
	}
	var errs []error
	for _, old := range s.cfg.Peers {
		if p, ok := want[old.Address]; ok && p == old {
			continue
		}
		if err := s.srv.DeletePeer(ctx, &api.DeletePeerRequest{Address: old.Address.String()}); err != nil {
			errs = append(errs, fmt.Errorf("bgp: remove peer %s: %w", old.Address, err))
			continue
		}
		delete(s.eor, old.Address)
		s.log.Info("peer removed", zap.Stringer("peer", old.Address))
	}
	have := map[netip.Addr]Peer{}
	for _, p := range s.cfg.Peers {
		have[p.Address] = p
	}
	for _, p := range cfg.Peers {
		if old, ok := have[p.Address]; ok && old == p {
			continue
		}
		if err := s.addPeer(ctx, p, false); err != nil {
			errs = append(errs, err)
		}
	}
	s.cfg.Peers = cfg.Peers
	s.poke()
	return errors.Join(errs...)
}

func peerRequest(p Peer, gr *api.GracefulRestart, restarting bool) *api.Peer {
	pgr := &api.GracefulRestart{Enabled: gr.Enabled, RestartTime: gr.RestartTime, DeferralTime: gr.DeferralTime, NotificationEnabled: gr.NotificationEnabled, LocalRestarting: restarting}
	var afs []*api.AfiSafi
	for _, v6 := range []bool{false, true} {
		if !p.carries(v6) {
			continue
		}
		fam := apiFamily(v6)
		afs = append(afs, &api.AfiSafi{
			Config:            &api.AfiSafiConfig{Family: fam, Enabled: true},
			MpGracefulRestart: &api.MpGracefulRestart{Config: &api.MpGracefulRestartConfig{Enabled: true}},
			PrefixLimits:      &api.PrefixLimit{Family: fam, MaxPrefixes: p.MaxPrefixes},
		})
	}
	return &api.Peer{
		Conf: &api.PeerConf{NeighborAddress: p.Address.String(), PeerAsn: p.ASN, AuthPassword: string(p.Password)},
		Timers: &api.Timers{Config: &api.TimersConfig{
			HoldTime: uint64(p.HoldTime / time.Second), KeepaliveInterval: uint64(p.Keepalive / time.Second), ConnectRetry: 5,
		}},
		Transport:       &api.Transport{RemotePort: uint32(p.Port)},
		GracefulRestart: pgr,
		AfiSafis:        afs,
	}
}

func apiFamily(v6 bool) *api.Family {
	if v6 {
		return &api.Family{Afi: api.Family_AFI_IP6, Safi: api.Family_SAFI_UNICAST}
	}
	return &api.Family{Afi: api.Family_AFI_IP, Safi: api.Family_SAFI_UNICAST}
}

func (s *Speaker) poke() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

func (s *Speaker) endOfRIB(p *apiutil.Path) {
	s.mu.Lock()
	if m, ok := s.eor[p.PeerAddress.Unmap()]; ok {
		m[p.Family] = true
	}
	s.mu.Unlock()
	s.poke()
}

func (s *Speaker) peerEvent(ev *apiutil.WatchEventMessage_PeerEvent) {
	if ev.Type != apiutil.PEER_EVENT_STATE {
		return
	}
	st := ev.Peer.State
	f := []zap.Field{zap.Stringer("peer", st.NeighborAddress), zap.Uint32("asn", st.PeerASN), zap.String("state", sessionState(st.SessionState))}
	if st.SessionState == bgp.BGP_FSM_ESTABLISHED {
		s.log.Info("session established", f...)
		return
	}
	if st.DisconnectMessage != "" {
		f = append(f, zap.String("reason", st.DisconnectMessage))
	}
	s.log.Info("session state", f...)
	s.mu.Lock()
	if m, ok := s.eor[st.NeighborAddress.Unmap()]; ok {
		clear(m)
	}
	if st.SessionState == bgp.BGP_FSM_IDLE && st.DisconnectMessage != "" {
		s.downReason[st.NeighborAddress.Unmap()] = st.DisconnectMessage
	}
	s.mu.Unlock()
	s.poke()
}

// SetLocal announces blocks (this node's, from the peer set) with the node's
// address of each family as next hop, withdraws what it no longer lists,
// and makes them, with addresses and services, what learned routes must
// never cover.
func (s *Speaker) SetLocal(blocks []netip.Prefix, addresses []netip.Addr, services []netip.Prefix) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.guard = Guard{Blocks: slices.Clone(blocks), Addresses: slices.Clone(addresses), Services: slices.Clone(services), Encrypted: s.guard.Encrypted}
	return s.reconcile()
}

// SetEncrypted names the other nodes' blocks WireGuard carries: learned
// routes over them are not installed (and the ones installed go).
func (s *Speaker) SetEncrypted(blocks []netip.Prefix) {
	s.mu.Lock()
	s.guard.Encrypted = slices.Clone(blocks)
	s.awaitEncrypted = false
	s.mu.Unlock()
	s.poke()
}

// SetServices announces Service addresses (ServiceRoutes) beside the
// blocks, next hop the node, and withdraws those no longer listed. They
// are not guarded: other nodes announce the same addresses.
func (s *Speaker) SetServices(routes []netip.Prefix) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.serviceRoutes = slices.Clone(routes)
	return s.reconcile()
}

// reconcile makes the announced set the blocks and Service routes, each
// with the node's address of its family (callers hold mu).
func (s *Speaker) reconcile() error {
	want := map[netip.Prefix]bool{}
	var errs []error
	for _, b := range append(slices.Clone(s.guard.Blocks), s.serviceRoutes...) {
		b = b.Masked()
		nh, ok := nextHopFor(b, s.guard.Addresses)
		if !ok {
			errs = append(errs, fmt.Errorf("bgp: %s: the node has no %s address to announce it with", b, familyName(b.Addr().Is6())))
			continue
		}
		want[b] = true
		if old, ok := s.announced[b]; ok && nextHopOf(old) == nh {
			continue
		}
		p, err := localPath(b, nh)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if _, err := s.srv.AddPath(apiutil.AddPathRequest{Paths: []*apiutil.Path{p}}); err != nil {
			errs = append(errs, fmt.Errorf("bgp: announce %s: %w", b, err))
			continue
		}
		s.announced[b] = p
		s.log.Info("announcing", zap.Stringer("prefix", b), zap.Stringer("nextHop", nh))
	}
	for b, p := range s.announced {
		if want[b] {
			continue
		}
		if err := s.srv.DeletePath(apiutil.DeletePathRequest{Paths: []*apiutil.Path{p}}); err != nil {
			errs = append(errs, fmt.Errorf("bgp: withdraw %s: %w", b, err))
			continue
		}
		delete(s.announced, b)
		s.log.Info("withdrew", zap.Stringer("prefix", b))
	}
	s.poke()
	return errors.Join(errs...)
}

func nextHopFor(b netip.Prefix, addrs []netip.Addr) (netip.Addr, bool) {
	for _, a := range addrs {
		if a.Is6() == b.Addr().Is6() && !a.IsLinkLocalUnicast() {
			return a, true
		}
	}
	return netip.Addr{}, false
}

func localPath(b netip.Prefix, nh netip.Addr) (*apiutil.Path, error) {
	nlri, err := bgp.NewIPAddrPrefix(b)
	if err != nil {
		return nil, fmt.Errorf("bgp: block %s: %w", b, err)
	}
	attrs := []bgp.PathAttributeInterface{bgp.NewPathAttributeOrigin(bgp.BGP_ORIGIN_ATTR_TYPE_IGP)}
	fam := bgp.RF_IPv4_UC
	if b.Addr().Is6() {
		fam = bgp.RF_IPv6_UC
		mp, err := bgp.NewPathAttributeMpReachNLRI(fam, []bgp.PathNLRI{{NLRI: nlri}}, nh)
		if err != nil {
			return nil, fmt.Errorf("bgp: block %s next hop %s: %w", b, nh, err)
		}
		attrs = append(attrs, mp)
	} else {
		a, err := bgp.NewPathAttributeNextHop(nh)
		if err != nil {
			return nil, fmt.Errorf("bgp: block %s next hop %s: %w", b, nh, err)
		}
		attrs = append(attrs, a)
	}
	return &apiutil.Path{Family: fam, Nlri: nlri, Attrs: attrs}, nil
}

// nextHopOf is a path's next hop (NEXT_HOP or MP_REACH's).
func nextHopOf(p *apiutil.Path) netip.Addr {
	for _, a := range p.Attrs {
		switch a := a.(type) {
		case *bgp.PathAttributeNextHop:
			return a.Value
		case *bgp.PathAttributeMpReachNLRI:
			return a.Nexthop
		}
	}
	return netip.Addr{}
}

// run syncs the kernel with the best paths after every burst of changes,
// and once more when a graceful restart's time is up.
func (s *Speaker) run(ctx context.Context) {
	var deadline <-chan time.Time
	if !s.restartDeadline.IsZero() {
		t := time.NewTimer(time.Until(s.restartDeadline))
		defer t.Stop()
		deadline = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-deadline:
			s.mu.Lock()
			if !s.pruning {
				s.log.Warn("graceful restart: restart time over before every peer re-sent its routes; pruning what is left of the previous run")
				s.pruning = true
			}
			s.mu.Unlock()
		case <-s.kick:
			time.Sleep(settle)
		}
		if err := s.sync(); err != nil {
			s.log.Error("kernel routes partly programmed", zap.Error(err))
		}
	}
}

// learnedPath is one best path to install.
type learnedPath struct {
	dst     netip.Prefix
	nextHop netip.Addr
}

// learnedPaths returns the best paths from peers (not this node's own).
func (s *Speaker) learnedPaths() ([]learnedPath, error) {
	var out []learnedPath
	for _, fam := range []bgp.Family{bgp.RF_IPv4_UC, bgp.RF_IPv6_UC} {
		err := s.srv.ListPath(apiutil.ListPathRequest{TableType: api.TableType_TABLE_TYPE_GLOBAL, Family: fam}, func(nlri bgp.NLRI, paths []*apiutil.Path) {
			pfx, ok := nlri.(*bgp.IPAddrPrefix)
			if !ok {
				return
			}
			for _, p := range paths {
				if !p.Best || p.Withdrawal || p.IsNexthopInvalid || !p.PeerAddress.IsValid() || p.PeerAddress.IsUnspecified() {
					continue
				}
				out = append(out, learnedPath{dst: pfx.Prefix.Masked(), nextHop: nextHopOf(p).Unmap()})
			}
		})
		if err != nil {
			return nil, fmt.Errorf("bgp: list %s paths: %w", fam, err)
		}
	}
	return out, nil
}

// sync installs the learned best paths the guard allows and, unless a
// graceful restart is still waiting for its peers, removes the others.
func (s *Speaker) sync() error {
	s.syncMu.Lock()
	defer s.syncMu.Unlock()
	s.mu.Lock()
	left := s.left
	s.mu.Unlock()
	if left {
		return nil
	}
	paths, err := s.learnedPaths()
	if err != nil {
		return err
	}
	s.mu.Lock()
	guard := s.guard
	if !s.pruning && s.allEndOfRIB() {
		s.pruning = true
		s.log.Info("graceful restart: every peer re-sent its routes; pruning what is left of the previous run")
	}
	prune := s.pruning
	if s.awaitEncrypted {
		paths = nil // WireGuard's blocks not known yet
	}
	s.mu.Unlock()
	var want []netlink.Route
	rejected := map[netip.Prefix]string{}
	for _, l := range paths {
		if why := guard.Reject(l.dst, l.nextHop); why != "" {
			rejected[l.dst] = why
			continue
		}
		want = append(want, kernelRoute(l))
	}
	s.mu.Lock()
	for dst, why := range rejected {
		if s.rejected[dst] != why {
			s.log.Warn("learned route not installed", zap.Stringer("prefix", dst), zap.String("reason", why))
		}
	}
	s.rejected = rejected
	s.installed = len(want)
	s.mu.Unlock()
	return errors.Join(routing.SyncProtocol(unix.RT_TABLE_MAIN, RouteProtocol, want, prune, s.log)...)
}

// allEndOfRIB: every configured peer has sent End-of-RIB for each family
// it carries (callers hold mu).
func (s *Speaker) allEndOfRIB() bool {
	for _, p := range s.cfg.Peers {
		for _, v6 := range []bool{false, true} {
			fam := bgp.RF_IPv4_UC
			if v6 {
				fam = bgp.RF_IPv6_UC
			}
			if p.carries(v6) && !s.eor[p.Address][fam] {
				return false
			}
		}
	}
	return true
}

// kernelRoute is the route for one learned path: via the next hop of the
// prefix's family, or through RTA_VIA when the families differ.
func kernelRoute(l learnedPath) netlink.Route {
	r := netlink.Route{Dst: ipNet(l.dst)}
	if l.nextHop.Is6() == l.dst.Addr().Is6() {
		r.Gw = l.nextHop.AsSlice()
		return r
	}
	fam := netlink.FAMILY_V4
	if l.nextHop.Is6() {
		fam = netlink.FAMILY_V6
	}
	r.Via = &netlink.Via{AddrFamily: fam, Addr: l.nextHop.AsSlice()}
	return r
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// Stop ends every session with a Cease: the peers withdraw this node's
// routes at once. A daemon that is only restarting does not call it.
func (s *Speaker) Stop() {
	_ = s.srv.StopBgp(context.Background(), &api.StopBgpRequest{})
	s.srv.Stop()
}

// Leave is this node leaving the fabric (its Node deleted), not
// restarting: every session ends with a Cease, so the peers withdraw its
// routes at once instead of keeping them for the restart time; the routes
// it installed leave the kernel, and the marker goes, so a later start is
// a fresh one.
func (s *Speaker) Leave() error {
	s.syncMu.Lock()
	defer s.syncMu.Unlock()
	s.mu.Lock()
	s.left = true
	s.mu.Unlock()
	s.Stop()
	errs := routing.SyncProtocol(unix.RT_TABLE_MAIN, RouteProtocol, nil, true, s.log)
	if err := os.Remove(filepath.Join(s.stateDir, startedFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	s.log.Info("left the fabric: sessions closed with a Cease, learned routes removed")
	return errors.Join(errs...)
}

func familyName(v6 bool) string {
	if v6 {
		return "IPv6"
	}
	return "IPv4"
}

func sessionState(st bgp.FSMState) string {
	switch st {
	case bgp.BGP_FSM_IDLE:
		return "Idle"
	case bgp.BGP_FSM_CONNECT:
		return "Connect"
	case bgp.BGP_FSM_ACTIVE:
		return "Active"
	case bgp.BGP_FSM_OPENSENT:
		return "OpenSent"
	case bgp.BGP_FSM_OPENCONFIRM:
		return "OpenConfirm"
	case bgp.BGP_FSM_ESTABLISHED:
		return "Established"
	}
	return "Unknown"
}

// Neighbor is one session as coordinoctl status shows it (never with its
// password).
type Neighbor struct {
	Address                  netip.Addr
	ASN                      uint32
	State                    string
	Received, Accepted, Sent uint64
	Problem                  string
}

// Neighbors reports every configured session, by address.
func (s *Speaker) Neighbors(ctx context.Context) ([]Neighbor, error) {
	var out []Neighbor
	err := s.srv.ListPeer(ctx, &api.ListPeerRequest{EnableAdvertised: true}, func(p *api.Peer) {
		if p.Conf == nil || p.State == nil {
			return
		}
		a, _ := netip.ParseAddr(p.Conf.NeighborAddress)
		n := Neighbor{Address: a, ASN: p.Conf.PeerAsn, State: apiSessionState(p.State.SessionState)}
		for _, af := range p.AfiSafis {
			if af.State != nil {
				n.Received += af.State.Received
				n.Accepted += af.State.Accepted
				n.Sent += af.State.Advertised
			}
		}
		if p.State.SessionState != api.PeerState_SESSION_STATE_ESTABLISHED {
			n.Problem = p.State.DisconnectMessage
			s.mu.Lock()
			if r := s.downReason[a]; r != "" {
				n.Problem = r
			}
			s.mu.Unlock()
		}
		out = append(out, n)
	})
	if err != nil {
		return nil, fmt.Errorf("bgp: list sessions: %w", err)
	}
	slices.SortFunc(out, func(a, b Neighbor) int { return a.Address.Compare(b.Address) })
	return out, nil
}

func apiSessionState(st api.PeerState_SessionState) string {
	switch st {
	case api.PeerState_SESSION_STATE_IDLE:
		return "Idle"
	case api.PeerState_SESSION_STATE_CONNECT:
		return "Connect"
	case api.PeerState_SESSION_STATE_ACTIVE:
		return "Active"
	case api.PeerState_SESSION_STATE_OPENSENT:
		return "OpenSent"
	case api.PeerState_SESSION_STATE_OPENCONFIRM:
		return "OpenConfirm"
	case api.PeerState_SESSION_STATE_ESTABLISHED:
		return "Established"
	}
	return "Unknown"
}
