// Command coordino-wireguard is the userspace WireGuard device for nodes
// whose kernel has no WireGuard module: wireguard-go on a TUN device,
// configured through the standard UAPI socket (/var/run/wireguard/<if>.sock)
// by the daemon's wgctrl client. The daemon starts it in its own process group so
// it keeps forwarding while the daemon restarts or is upgraded; a restarted
// daemon adopts it through the socket.
package main

import (
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"strconv"

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
	flag.Parse()
	if err := run(*ifname, *mtu, *pidFile, *verbose); err != nil {
		fmt.Fprintln(os.Stderr, "coordino-wireguard:", err)
		os.Exit(1)
	}
}

func run(ifname string, mtu int, pidFile string, verbose bool) error {
	// Microseconds: a handshake between namespaces takes well under a millisecond.
	out := log.New(os.Stdout, fmt.Sprintf("(%s) ", ifname), log.Ldate|log.Lmicroseconds)
	logger := &device.Logger{Verbosef: device.DiscardLogf, Errorf: out.Printf}
	if verbose {
		logger.Verbosef = out.Printf
	}
	tdev, err := tun.CreateTUN(ifname, mtu)
	if err != nil {
		return fmt.Errorf("create TUN %s: %w", ifname, err)
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
	term := make(chan os.Signal, 1)
	signal.Notify(term, unix.SIGTERM, os.Interrupt)
	select {
	case <-term:
		return nil
	case err := <-errs:
		return fmt.Errorf("UAPI: %w", err)
	case <-dev.Wait():
		return nil
	}
}
