package testbed

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Daemon is a coordino-daemon the bed runs in the host network namespace (the
// host is the node in the runtime e2e).
type Daemon struct {
	*Proc
	RunDir, StateDir, BPFDir string
	CIDRs                    []string
}

// StartDaemon starts coordino-daemon in standalone mode with its run and
// state dirs under base (the test's temp dir) and its pins in bpfDir (which
// must be on bpffs), and waits for its socket and metrics address.
func (b *Bed) StartDaemon(ctx context.Context, bin, base, bpfDir, node string, cidrs ...string) (*Daemon, error) {
	d := &Daemon{
		RunDir: filepath.Join(base, "run"), StateDir: filepath.Join(base, "state"),
		BPFDir: bpfDir, CIDRs: cidrs,
	}
	args := []string{"--standalone", "--node-name", node,
		"--run-dir", d.RunDir, "--state-dir", d.StateDir, "--bpf-dir", d.BPFDir,
		"--metrics-addr", "127.0.0.1:0"}
	for _, c := range cidrs {
		args = append(args, "--pod-cidr", c)
	}
	d.Proc = &Proc{Name: "coordino-daemon", Path: bin, Args: args}
	b.daemons = append(b.daemons, d)
	return d, b.startDaemon(ctx, d)
}

func (b *Bed) startDaemon(ctx context.Context, d *Daemon) error {
	_ = os.Remove(filepath.Join(d.RunDir, "metrics.addr"))
	if err := b.Start(d.Proc); err != nil {
		return err
	}
	return WaitFor(ctx, "coordino-daemon socket", 30*time.Second, func() error {
		if !d.Running() {
			return fmt.Errorf("coordino-daemon exited, see %s", d.LogPath)
		}
		c, err := net.Dial("unix", filepath.Join(d.RunDir, "coordino.sock"))
		if err != nil {
			return err
		}
		c.Close()
		_, err = os.Stat(filepath.Join(d.RunDir, "metrics.addr"))
		return err
	})
}

// RestartDaemon starts a stopped daemon again with the same flags and dirs.
func (b *Bed) RestartDaemon(ctx context.Context, d *Daemon) error {
	fresh := &Proc{Name: d.Name, Path: d.Path, Args: d.Args, LogPath: d.LogPath}
	d.Proc = fresh
	return b.startDaemon(ctx, d)
}

// Metrics fetches the daemon's Prometheus text and returns sample values by
// metric name including labels (e.g. `coordino_endpoints{mode="primary"}`).
func (d *Daemon) Metrics() (map[string]float64, error) {
	addr, err := os.ReadFile(filepath.Join(d.RunDir, "metrics.addr"))
	if err != nil {
		return nil, err
	}
	a := strings.TrimSpace(string(addr))
	if !strings.Contains(a, "://") {
		a = "http://" + a
	}
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(strings.TrimSuffix(a, "/") + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	m := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if l == "" || l[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(l, ' ')
		if i < 0 {
			continue
		}
		if v, err := strconv.ParseFloat(l[i+1:], 64); err == nil {
			m[l[:i]] = v
		}
	}
	return m, sc.Err()
}

// UsedAddresses sums the daemon's coordino_ipam_addresses{state="used"}
// gauges over all blocks.
func (d *Daemon) UsedAddresses() (float64, error) {
	m, err := d.Metrics()
	if err != nil {
		return 0, err
	}
	var used float64
	found := false
	for k, v := range m {
		if strings.HasPrefix(k, "coordino_ipam_addresses{") && strings.Contains(k, `state="used"`) {
			used += v
			found = true
		}
	}
	if !found {
		return 0, fmt.Errorf("daemon metrics have no coordino_ipam_addresses{state=\"used\"}")
	}
	return used, nil
}

// Requests returns how many times the daemon served verb (e.g. "ADD") since
// it started, and how many of those failed.
func (d *Daemon) Requests(verb string) (served, failed float64, err error) {
	m, err := d.Metrics()
	if err != nil {
		return 0, 0, err
	}
	label := strings.ToLower(`verb="` + verb + `"`)
	for k, v := range m {
		lk := strings.ToLower(k)
		switch {
		case strings.HasPrefix(lk, "coordino_cni_request_duration_seconds_count{") && strings.Contains(lk, label):
			served += v
		case strings.HasPrefix(lk, "coordino_cni_errors_total{") && strings.Contains(lk, label):
			failed += v
		}
	}
	return served, failed, nil
}

// NetnsPins lists the daemon's netns pins (<run-dir>/netns/*).
func (d *Daemon) NetnsPins() []string {
	ents, _ := os.ReadDir(filepath.Join(d.RunDir, "netns"))
	var pins []string
	for _, e := range ents {
		pins = append(pins, e.Name())
	}
	return pins
}

// HostLinks lists host interfaces whose name starts with prefix (Coordino's
// host-side veths are "cdo*").
func HostLinks(prefix string) []string {
	ifs, _ := net.Interfaces()
	var names []string
	for _, i := range ifs {
		if strings.HasPrefix(i.Name, prefix) {
			names = append(names, i.Name)
		}
	}
	return names
}

// CheckCIDRsFree fails when a host route overlaps one of the CIDRs: the
// daemon runs in the host namespace and must not shadow real networks.
func CheckCIDRsFree(cidrs ...string) error {
	for _, fam := range []string{"-4", "-6"} {
		out, err := exec.Command("ip", fam, "route", "show", "table", "all").Output()
		if err != nil {
			return err
		}
		for _, l := range strings.Split(string(out), "\n") {
			f := strings.Fields(l)
			if len(f) == 0 {
				continue
			}
			dst := f[0]
			if dst == "default" || dst == "local" || dst == "broadcast" || dst == "multicast" || dst == "unreachable" {
				continue
			}
			rp, err := netip.ParsePrefix(dst)
			if err != nil {
				a, err := netip.ParseAddr(dst)
				if err != nil {
					continue
				}
				rp = netip.PrefixFrom(a, a.BitLen())
			}
			if rp.Addr().IsLinkLocalUnicast() || rp.Addr().IsMulticast() {
				continue
			}
			for _, c := range cidrs {
				p := netip.MustParsePrefix(c)
				if p.Overlaps(rp) && !strings.Contains(l, "dev "+bedBridge) && !strings.Contains(l, "dev cdo") {
					return fmt.Errorf("CIDR %s overlaps host route %q", c, l)
				}
			}
		}
	}
	return nil
}
