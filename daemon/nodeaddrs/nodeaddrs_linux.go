package nodeaddrs

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"go.uber.org/zap"
)

// List returns the node's global-scope addresses in the kernel's order.
func List() ([]netip.Addr, error) {
	addrs, err := list(netlink.NewHandle)
	if err != nil {
		return nil, err
	}
	out := make([]netip.Addr, 0, len(addrs))
	for _, a := range addrs {
		out = append(out, a.ip)
	}
	return out, nil
}

// ifAddr is one address on one interface: the same address may sit on two.
type ifAddr struct {
	index int
	ip    netip.Addr
}

// list dumps the global-scope addresses of the namespace the handle opens.
// A variable so a test can count the dumps.
var list = func(open func(...int) (*netlink.Handle, error)) ([]ifAddr, error) {
	h, err := open()
	if err != nil {
		return nil, fmt.Errorf("list node addresses: %w", err)
	}
	defer h.Close()
	addrs, err := h.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("list node addresses: %w", err)
	}
	var out []ifAddr
	for _, a := range addrs {
		if a.Scope != int(netlink.SCOPE_UNIVERSE) {
			continue
		}
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			out = append(out, ifAddr{a.LinkIndex, ip.Unmap()})
		}
	}
	return out, nil
}

// resubscribeEvery is the pause before a failed watch (its socket
// overflowed, say) is opened again.
const resubscribeEvery = time.Second

// Watch calls set with the node's addresses each time they change, from
// current (what the caller's datapath already has), until ctx is done. The
// watch follows the namespace ns (netns.None(): the daemon's own). A watch
// whose socket fails is re-opened and the addresses listed again, so no
// change is lost for good.
func Watch(ctx context.Context, ns netns.NsHandle, current []netip.Addr, set func([]netip.Addr) error, log *zap.Logger) error {
	w := &watch{ns: ns, set: set, log: log, sent: sorted(current)}
	sub, err := w.subscribe()
	if err != nil {
		return err
	}
	if err := w.resync(); err != nil {
		sub.close()
		return err
	}
	go w.run(ctx, sub)
	return nil
}

type watch struct {
	ns   netns.NsHandle
	set  func([]netip.Addr) error
	log  *zap.Logger
	have map[ifAddr]struct{}
	sent []netip.Addr // sorted, as last given to set
}

type subscription struct {
	updates chan netlink.AddrUpdate
	done    chan struct{}
	closed  *atomic.Bool // the socket's error on close is no news
}

func (w *watch) subscribe() (subscription, error) {
	s := subscription{updates: make(chan netlink.AddrUpdate, 64), done: make(chan struct{}), closed: new(atomic.Bool)}
	ns := w.ns
	closed := s.closed
	if err := netlink.AddrSubscribeWithOptions(s.updates, s.done, netlink.AddrSubscribeOptions{
		Namespace: &ns,
		ErrorCallback: func(err error) {
			if !closed.Load() {
				w.log.Warn("node address watch", zap.Error(err))
			}
		},
	}); err != nil {
		return s, fmt.Errorf("watch node addresses: %w", err)
	}
	return s, nil
}

// resync replaces the set with a fresh list. The subscription is opened
// first, so a change made meanwhile is in the list, in the events that
// follow, or in both (applying an event twice changes nothing).
func (w *watch) resync() error {
	addrs, err := list(func(...int) (*netlink.Handle, error) { return netlink.NewHandleAt(w.ns) })
	if err != nil {
		return err
	}
	w.have = make(map[ifAddr]struct{}, len(addrs))
	for _, a := range addrs {
		w.have[a] = struct{}{}
	}
	w.publish()
	return nil
}

func (w *watch) run(ctx context.Context, sub subscription) {
	defer func() { sub.close() }()
	for {
		select {
		case <-ctx.Done():
			return
		case u, ok := <-sub.updates:
			if ok {
				w.apply(u)
				continue
			}
		}
		sub.close()
		w.log.Warn("node address watch closed: re-opening it", zap.Duration("after", resubscribeEvery))
		for sub.done == nil {
			select {
			case <-ctx.Done():
				return
			case <-time.After(resubscribeEvery):
			}
			next, err := w.subscribe()
			if err == nil {
				if err = w.resync(); err == nil {
					sub = next
					continue
				}
				next.close()
			}
			w.log.Error("re-open node address watch: host identity does not follow address changes meanwhile", zap.Error(err))
		}
	}
}

// close ends the subscription's socket; once is enough.
func (s *subscription) close() {
	if s.done != nil {
		s.closed.Store(true)
		close(s.done)
		s.done = nil
	}
}

// apply takes one event into the set. Only global addresses are the node's:
// the link-local address every new veth gets costs nothing here.
func (w *watch) apply(u netlink.AddrUpdate) {
	if u.Scope != int(netlink.SCOPE_UNIVERSE) {
		return
	}
	ip, ok := netip.AddrFromSlice(u.LinkAddress.IP)
	if !ok {
		return
	}
	a := ifAddr{u.LinkIndex, ip.Unmap()}
	if u.NewAddr {
		w.have[a] = struct{}{}
	} else {
		delete(w.have, a)
	}
	w.publish()
}

// publish hands the set to the datapath when it differs from what it has.
func (w *watch) publish() {
	ips := make([]netip.Addr, 0, len(w.have))
	for a := range w.have {
		ips = append(ips, a.ip)
	}
	ips = sorted(ips)
	if slices.Equal(ips, w.sent) {
		return
	}
	if err := w.set(ips); err != nil {
		w.log.Error("update node addresses in the datapath", zap.Error(err))
		return
	}
	w.sent = ips
	w.log.Info("node addresses changed", zap.Stringers("addresses", ips))
}

func sorted(ips []netip.Addr) []netip.Addr {
	out := slices.Clone(ips)
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}
