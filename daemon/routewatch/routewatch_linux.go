package routewatch

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// groups are the netlink multicast groups whose messages can change a FIB
// lookup's answer: links (up, down, MTU, gone), routes, rules, nexthops.
var groups = []uint{
	unix.RTNLGRP_LINK,
	unix.RTNLGRP_IPV4_ROUTE, unix.RTNLGRP_IPV6_ROUTE,
	unix.RTNLGRP_IPV4_RULE, unix.RTNLGRP_IPV6_RULE,
	unix.RTNLGRP_NEXTHOP,
}

// reopenAfter is the pause before a failed watch is opened again.
const reopenAfter = time.Second

// Watch calls changed once the watch is open, and then after notifications
// from ns (netns.None(): the daemon's own namespace), until ctx is done:
// every notification is followed by a call that starts after it arrived.
// No message is parsed: any of them may move a packet. Notifications lost to
// an overflowing socket, or while a failed watch is re-opened, count as a
// change.
func Watch(ctx context.Context, ns netns.NsHandle, changed func(), log *zap.Logger) error {
	s, err := subscribe(ns)
	if err != nil {
		return err
	}
	changed()
	// A pod's creation alone brings a burst of link and route messages:
	// those arriving while changed runs are told by one more call.
	pending := make(chan struct{}, 1)
	tell := func() {
		select {
		case pending <- struct{}{}:
		default:
		}
	}
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-pending:
				changed()
			}
		}
	}()
	go run(ctx, ns, s, tell, log)
	return nil
}

func subscribe(ns netns.NsHandle) (*nl.NetlinkSocket, error) {
	var (
		s   *nl.NetlinkSocket
		err error
	)
	if ns.IsOpen() {
		s, err = nl.SubscribeAt(ns, netns.None(), unix.NETLINK_ROUTE, groups...)
	} else {
		s, err = nl.Subscribe(unix.NETLINK_ROUTE, groups...)
	}
	if err != nil {
		return nil, fmt.Errorf("watch routes: %w", err)
	}
	return s, nil
}

func run(ctx context.Context, ns netns.NsHandle, s *nl.NetlinkSocket, changed func(), log *zap.Logger) {
	for {
		stop := context.AfterFunc(ctx, s.Close)
		err := receive(s, changed)
		if stop() {
			s.Close()
		}
		if ctx.Err() != nil {
			return
		}
		log.Warn("route watch failed: re-opening it", zap.Error(err), zap.Duration("after", reopenAfter))
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(reopenAfter):
			}
			if s, err = subscribe(ns); err == nil {
				break
			}
			log.Error("re-open route watch: host routing's next hops may be a second old meanwhile", zap.Error(err))
		}
		changed()
	}
}

// receive calls changed after every read from s, until s fails.
func receive(s *nl.NetlinkSocket, changed func()) error {
	for {
		_, _, err := s.Receive()
		if err != nil && !errors.Is(err, unix.ENOBUFS) {
			return err
		}
		changed()
	}
}
