package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
)

// throughput runs one iperf3 test client→server and returns the received
// rate in Gbit/s. The server may still be finishing the previous test, so
// a busy answer is retried.
func (s *side) throughput(ctx context.Context, seconds int) (float64, error) {
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		if attempt > 0 {
			time.Sleep(200 * time.Millisecond)
		}
		cmd := exec.CommandContext(ctx, "nsenter", "--net="+s.client.hp.NS.Path(), "--", "iperf3", "-c", s.server.ip.String(),
			"-p", fmt.Sprint(iperfPort), "-t", fmt.Sprint(seconds), "-J", "--connect-timeout", "2000")
		var out bytes.Buffer
		cmd.Stdout = &out
		runErr := cmd.Run()
		var res struct {
			Error string `json:"error"`
			End   struct {
				SumReceived struct {
					BitsPerSecond float64 `json:"bits_per_second"`
				} `json:"sum_received"`
			} `json:"end"`
		}
		if err := json.Unmarshal(out.Bytes(), &res); err != nil {
			lastErr = fmt.Errorf("iperf3: %v; output %q", runErr, out.String())
			continue
		}
		if res.Error != "" {
			lastErr = fmt.Errorf("iperf3: %s", res.Error)
			if strings.Contains(res.Error, "busy") || strings.Contains(res.Error, "refused") {
				continue
			}
			return 0, lastErr
		}
		if runErr != nil {
			return 0, fmt.Errorf("iperf3: %w", runErr)
		}
		return res.End.SumReceived.BitsPerSecond / 1e9, nil
	}
	return 0, lastErr
}

// connRate opens and immediately resets TCP connections client→server
// from workers goroutines for d and returns completed handshakes per
// second and the number of failed attempts. Each connection is a new flow:
// a policy decision, a conntrack entry, and a SYN through every rule list.
func (s *side) connRate(ctx context.Context, d time.Duration, workers int) (float64, int, error) {
	target := netip.AddrPortFrom(s.server.ip, connPort).String()
	var ok, failed atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	start := time.Now()
	deadline := start.Add(d)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// The whole loop runs inside the client netns: every socket is the client's.
			errs <- s.client.hp.NS.Do(func(ns.NetNS) error {
				dialer := net.Dialer{Timeout: time.Second}
				for time.Now().Before(deadline) && ctx.Err() == nil {
					c, err := dialer.DialContext(ctx, "tcp", target)
					if err != nil {
						failed.Add(1)
						continue
					}
					// RST instead of FIN: no TIME_WAIT, so ports never run out.
					_ = c.(*net.TCPConn).SetLinger(0)
					c.Close()
					ok.Add(1)
				}
				return nil
			})
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return 0, 0, err
		}
	}
	if err := ctx.Err(); err != nil {
		return 0, 0, err
	}
	return float64(ok.Load()) / time.Since(start).Seconds(), int(failed.Load()), nil
}
