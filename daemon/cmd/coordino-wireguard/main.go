// Command coordino-wireguard is the userspace WireGuard device for nodes
// whose kernel has no WireGuard module: wireguard-go on a TUN device,
// configured through the standard UAPI socket (/var/run/wireguard/<if>.sock)
// by the daemon's wgctrl client. The daemon starts it in its own process group so
// it keeps forwarding while the daemon restarts; a restarted daemon adopts it
// through the socket. In Kubernetes the daemon's container ends with its pod,
// so the coordino-wireguard DaemonSet runs it instead (with --wait-for-name,
// --wireguard-device-kind=external): replacing the daemon then leaves the
// tunnel up.
package main

import (
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/device"
	"golang.zx2c4.com/wireguard/ipc"
	"golang.zx2c4.com/wireguard/tun"
)

func main() {
	ifname := flag.String("interface", "coordino-wg", "device name (unique per network namespace sharing /var/run/wireguard)")
	mtu := flag.Int("mtu", device.DefaultMTU, "device MTU")
	pidFile := flag.String("pid-file", "", "write the process ID here")
	verbose := flag.Bool("verbose", false, "log every handshake")
	waitName := flag.Bool("wait-for-name", false, "while another process's TUN holds the name, wait for it to go instead of failing (the hand-over from a device the daemon started)")
	flag.Parse()
	term := make(chan os.Signal, 1)
	signal.Notify(term, unix.SIGTERM, os.Interrupt)
	if err := run(*ifname, *mtu, *pidFile, *verbose, *waitName, term); err != nil {
		fmt.Fprintln(os.Stderr, "coordino-wireguard:", err)
		os.Exit(1)
	}
}

func run(ifname string, mtu int, pidFile string, verbose, waitName bool, term <-chan os.Signal) error {
	// Microseconds: a handshake between namespaces takes well under a millisecond.
	out := log.New(os.Stdout, fmt.Sprintf("(%s) ", ifname), log.Ldate|log.Lmicroseconds)
	logger := &device.Logger{Verbosef: device.DiscardLogf, Errorf: out.Printf}
	if verbose {
		logger.Verbosef = out.Printf
	}
	tdev, err := createTUN(ifname, mtu, waitName, term, out)
	if err != nil || tdev == nil {
		return err
	}
	uapiFile, err := ipc.UAPIOpen(ifname)
	if err != nil {
		tdev.Close()
		return fmt.Errorf("open UAPI socket for %s: %w", ifname, err)
	}
	dev := device.NewDevice(tdev, conn.NewDefaultBind(), logger)
	defer dev.Close()
	uapi, err := ipc.UAPIListen(ifname, uapiFile)
	if err != nil {
		return fmt.Errorf("listen on UAPI socket for %s: %w", ifname, err)
	}
	defer uapi.Close()
	errs := make(chan error, 1)
	go func() {
		for {
			c, err := uapi.Accept()
			if err != nil {
				errs <- err
				return
			}
			go dev.IpcHandle(c)
		}
	}()
	if pidFile != "" {
		if err := os.WriteFile(pidFile, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o600); err != nil {
			return err
		}
		defer os.Remove(pidFile)
	}
	select {
	case <-term:
		return nil
	case err := <-errs:
		return fmt.Errorf("UAPI: %w", err)
	case <-dev.Wait():
		return nil
	}
}

// createTUN creates the TUN named ifname. With wait, a name held by another
// process's TUN (EBUSY: the device a daemon started, still forwarding) is
// retried until that process ends, so the tunnel changes hands without a
// second device; a nil device means term arrived first.
func createTUN(ifname string, mtu int, wait bool, term <-chan os.Signal, out *log.Logger) (tun.Device, error) {
	logged := false
	for {
		tdev, err := tun.CreateTUN(ifname, mtu)
		if err == nil {
			return tdev, nil
		}
		if !wait || !errors.Is(err, unix.EBUSY) {
			return nil, fmt.Errorf("create TUN %s: %w", ifname, err)
		}
		if !logged {
			out.Printf("another process's TUN holds the name: waiting for it to end")
			logged = true
		}
		select {
		case <-term:
			return nil, nil
		case <-time.After(50 * time.Millisecond):
		}
	}
}
