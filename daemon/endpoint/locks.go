package endpoint

import (
	"sync"

	"github.com/coordino/coordino/daemon/netsetup"
	"github.com/coordino/coordino/daemon/store"
)

// lockKey takes the lock of attachment k. Locks are named by the host
// interface name derived from the key, which is also the name of its primary
// veth and netns pin: the orphan sweep knows only those names and takes the
// same lock before it removes anything.
func (m *Manager) lockKey(k store.Key) (unlock func()) {
	return m.locks.lockName(netsetup.HostIfName(k.Network, k.ContainerID, k.IfName))
}

// keyedMutex serialises work under one lock name; distinct names never wait
// on each other. Callers go through lockKey (or the orphan sweep's host
// interface names), never a key's String(), so that every path agrees on
// the name.
type keyedMutex struct {
	mu    sync.Mutex
	locks map[string]*keyLock
}

type keyLock struct {
	sync.Mutex
	refs int
}

func (k *keyedMutex) lockName(key string) (unlock func()) {
	k.mu.Lock()
	if k.locks == nil {
		k.locks = map[string]*keyLock{}
	}
	l := k.locks[key]
	if l == nil {
		l = &keyLock{}
		k.locks[key] = l
	}
	l.refs++
	k.mu.Unlock()

	l.Lock()
	return func() {
		l.Unlock()
		k.mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(k.locks, key)
		}
		k.mu.Unlock()
	}
}
