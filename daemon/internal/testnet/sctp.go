package testnet

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// SCTP has no support in Go's net package: these use one-to-one style
// sockets (SOCK_STREAM, IPPROTO_SCTP), which connect, accept, read and
// write like TCP's.

// SCTPSupport reports whether this kernel opens SCTP sockets (loading the
// sctp module on demand), and whether it claims SCTP at all: built in or
// shipped as a module.
func SCTPSupport() (works, claimed bool) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_SCTP)
	if err == nil {
		unix.Close(fd)
		return true, true
	}
	var uts unix.Utsname
	if unix.Uname(&uts) != nil {
		return false, false
	}
	dir := filepath.Join("/lib/modules", unix.ByteSliceToString(uts.Release[:]))
	for _, list := range []string{"modules.dep", "modules.builtin"} {
		f, err := os.Open(filepath.Join(dir, list))
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			path, _, _ := strings.Cut(sc.Text(), ":")
			if strings.HasPrefix(filepath.Base(path), "sctp.ko") {
				f.Close()
				return false, true
			}
		}
		f.Close()
	}
	return false, false
}

// ServeSCTP echoes what it receives on SCTP port inside the pod until
// cleanup.
func (p *Pod) ServeSCTP(t testing.TB, port int) {
	t.Helper()
	var fd int
	err := p.Do(func() error {
		var err error
		if fd, err = unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_SCTP); err != nil {
			return fmt.Errorf("socket: %w", err)
		}
		if err := unix.Bind(fd, &unix.SockaddrInet4{Port: port}); err != nil {
			unix.Close(fd)
			return fmt.Errorf("bind port %d: %w", port, err)
		}
		return unix.Listen(fd, 16)
	})
	if err != nil {
		t.Fatalf("pod %s: serve SCTP: %v", p.Name, err)
	}
	// shutdown wakes the blocked accept; close alone does not.
	t.Cleanup(func() { _ = unix.Shutdown(fd, unix.SHUT_RDWR); _ = unix.Close(fd) })
	go func() {
		for {
			c, _, err := unix.Accept(fd)
			if err != nil {
				return
			}
			go func() {
				defer unix.Close(c)
				buf := make([]byte, 2048)
				for {
					n, err := unix.Read(c, buf)
					if err != nil || n <= 0 {
						return
					}
					if _, err := unix.Write(c, buf[:n]); err != nil {
						return
					}
				}
			}()
		}
	}()
}

// probeSCTP associates with dst:port from the calling thread's netns,
// sends a line and waits for its echo, all within Timeout: a dropped INIT
// shows as a timeout.
func probeSCTP(dst [4]byte, port int) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, unix.IPPROTO_SCTP)
	if err != nil {
		return fmt.Errorf("socket: %w", err)
	}
	defer unix.Close(fd)
	deadline := time.Now().Add(Timeout)
	err = unix.Connect(fd, &unix.SockaddrInet4{Addr: dst, Port: port})
	if err != nil && !errors.Is(err, unix.EINPROGRESS) {
		return fmt.Errorf("connect: %w", err)
	}
	if err := waitFD(fd, unix.POLLOUT, deadline); err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	if soErr, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR); err != nil || soErr != 0 {
		return fmt.Errorf("connect: %v", errors.Join(err, unix.Errno(soErr)))
	}
	msg := []byte("ping " + randHex(4))
	if _, err := unix.Write(fd, msg); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	if err := waitFD(fd, unix.POLLIN, deadline); err != nil {
		return fmt.Errorf("read: %w", err)
	}
	buf := make([]byte, 64)
	n, err := unix.Read(fd, buf)
	if err != nil {
		return fmt.Errorf("read: %w", err)
	}
	if string(buf[:n]) != string(msg) {
		return errors.New("echo mismatch")
	}
	return nil
}

// waitFD polls fd for events until deadline.
func waitFD(fd int, events int16, deadline time.Time) error {
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return os.ErrDeadlineExceeded
		}
		pfd := []unix.PollFd{{Fd: int32(fd), Events: events}}
		n, err := unix.Poll(pfd, int(left.Milliseconds())+1)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		if n > 0 {
			return nil
		}
	}
}
