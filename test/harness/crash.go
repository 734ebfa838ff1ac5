package harness

import (
	"syscall"
	"time"
)

// CrashDuringStart starts the daemon and SIGKILLs it after delay, while it
// is (most likely) still restoring state, then leaves it stopped. Crash
// tests use it to interrupt recovery itself.
func (n *Node) CrashDuringStart(delay time.Duration) error {
	if err := n.startDaemonProcess(); err != nil {
		return err
	}
	time.Sleep(delay)
	return n.StopDaemon(syscall.SIGKILL)
}
