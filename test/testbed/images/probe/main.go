package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"strconv"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "serve":
		fs := flag.NewFlagSet("serve", flag.ExitOnError)
		port := fs.Int("port", 8080, "TCP and UDP port")
		_ = fs.Parse(os.Args[2:])
		err = serve(*port)
	case "dial":
		if len(os.Args) != 4 {
			usage()
		}
		err = dial(os.Args[2], os.Args[3])
	case "addrs":
		err = addrs()
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "probe:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: probe serve [-port N] | dial tcp|udp HOST:PORT | addrs")
	os.Exit(2)
}

func serve(port int) error {
	addr := net.JoinHostPort("", strconv.Itoa(port))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		return err
	}
	go func() {
		buf := make([]byte, 64<<10)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				log.Fatal(err)
			}
			_, _ = pc.WriteTo(buf[:n], from)
		}
	}()
	log.Printf("serving tcp+udp on %s", addr)
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go func() {
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(30 * time.Second))
			_, _ = io.Copy(c, c)
		}()
	}
}

// dial retries briefly: a pod that has just become Running may not have its
// server listening yet, and the test wants to know about connectivity, not
// about that race.
func dial(network, addr string) error {
	token := []byte(fmt.Sprintf("coordino-probe-%d", time.Now().UnixNano()))
	var last error
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if last = roundTrip(network, addr, token); last == nil {
			fmt.Printf("ok %s %s\n", network, addr)
			return nil
		}
	}
	return last
}

func roundTrip(network, addr string, token []byte) error {
	c, err := net.DialTimeout(network, addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write(token); err != nil {
		return err
	}
	got := make([]byte, len(token))
	if _, err := io.ReadFull(c, got); err != nil {
		return err
	}
	if !bytes.Equal(got, token) {
		return fmt.Errorf("echo mismatch: %q", got)
	}
	return nil
}

func addrs() error {
	ifs, err := net.Interfaces()
	if err != nil {
		return err
	}
	for _, i := range ifs {
		as, _ := i.Addrs()
		for _, a := range as {
			fmt.Printf("%s %s\n", i.Name, a)
		}
	}
	return nil
}
