package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/coordino/coordino/proto/deletequeue"
	"github.com/coordino/coordino/test/harness"
)

// The demo's addressing. Everything lives inside namespaces the demo
// creates, so these never meet the host's own networks.
const (
	nodeName     = "demo-node"
	podCIDR4     = "10.244.1.0/24"
	podCIDR6     = "fd00:10:244:1::/64"
	chainedCIDR  = "10.88.0.0/24"
	bridgeName   = "cni0"
	primaryNet   = "demo"
	chainedNet   = "demo-chained"
	servePort    = 8080
	stepCount    = 9
	cleanupLimit = 30 * time.Second
)

type options struct {
	out   io.Writer
	color bool
}

// demo is the state of one tour; teardown undoes all of it.
type demo struct {
	ctx     context.Context
	ui      *ui
	dir     string
	node    *harness.Node
	primary *harness.CNI
	chained *harness.CNI // nil when chained ADD failed
	pods    []*pod       // every pod ever created, for teardown
	stops   []func()     // TCP servers
	byName  map[string]*pod
	torn    bool
}

// pod is a pod netns plus what its runtime remembers about the attachment.
type pod struct {
	*harness.Pod
	cni      *harness.CNI
	rt       *libcni.RuntimeConf
	result   *current.Result
	addrs    []netip.Addr
	hostVeth string
	took     time.Duration
	attached bool
}

func (p *pod) v4() netip.Addr { return p.family(true) }
func (p *pod) v6() netip.Addr { return p.family(false) }

func (p *pod) family(v4 bool) netip.Addr {
	for _, a := range p.addrs {
		if a.Is4() == v4 {
			return a
		}
	}
	return netip.Addr{}
}

// run is the whole tour; main and the test both call it.
func run(ctx context.Context, opts options) (err error) {
	u := newUI(opts.out, opts.color, stepCount)
	if os.Geteuid() != 0 {
		return errors.New("the demo needs root (network namespaces, bind mounts, bpffs): try sudo")
	}
	if err := harness.RequireBinaries(); err != nil {
		return err
	}
	d := &demo{ctx: ctx, ui: u, byName: map[string]*pod{}}
	u.printf("%s\n", u.style(styleBold, "Coordino demo: a node, its daemon and a handful of pods, on plain network namespaces"))
	defer func() {
		if d.torn {
			return
		}
		// An error or an interrupt ended the tour early: still leave nothing behind.
		if ctx.Err() != nil {
			u.printf("\n%s\n", u.style(styleYellow, "interrupted: cleaning up"))
		}
		if terr := d.teardown(false); terr != nil {
			u.printf("   %s cleanup: %v\n", u.style(styleRed, "✗"), terr)
			err = errors.Join(err, terr)
		}
	}()
	steps := []func() error{
		d.startNode, d.attachPods, d.connectivity, d.checkBreakRepair, d.chainedMode,
		d.daemonRestart, d.garbageCollect, d.metrics, d.cleanUp,
	}
	for _, step := range steps {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("interrupted: %w", err)
		}
		if err := step(); err != nil {
			if ctx.Err() != nil {
				// The step failed because we were interrupted: no post-mortem.
				return fmt.Errorf("interrupted: %w", ctx.Err())
			}
			u.printf("   %s %v\n", u.style(styleRed, "✗ cannot go on:"), err)
			if d.node != nil {
				u.printf("     %s\n", u.style(styleDim, "daemon log tail:"))
				for _, l := range strings.Split(d.node.LogTail(15), "\n") {
					u.printf("     %s\n", u.style(styleDim, l))
				}
			}
			return err
		}
	}
	return u.summary()
}

// newPod creates a pod netns and remembers it for teardown.
func (d *demo) newPod(c *harness.CNI, name string) (*pod, error) {
	hp, err := harness.NewPod(name)
	if err != nil {
		return nil, err
	}
	p := &pod{Pod: hp, cni: c, rt: harness.RuntimeConf(hp, "eth0")}
	d.pods = append(d.pods, p)
	d.byName[name] = p
	return p, nil
}

// add runs ADD for p as a runtime would and records the result.
func (d *demo) add(p *pod) error {
	// Set first: DEL is idempotent, so teardown also undoes a half-done ADD.
	p.attached = true
	start := time.Now()
	res, err := p.cni.Add(d.ctx, p.rt)
	p.took = time.Since(start)
	if err != nil {
		return fmt.Errorf("ADD %s: %w", p.Name, err)
	}
	if p.result, err = current.NewResultFromResult(res); err != nil {
		return err
	}
	if p.addrs, err = harness.Addresses(res); err != nil {
		return err
	}
	// The host side is the last interface outside the sandbox (a bridge
	// result lists the bridge first, then the veth).
	for _, i := range p.result.Interfaces {
		if i.Sandbox == "" {
			p.hostVeth = i.Name
		}
	}
	return nil
}

// del runs DEL for p.
func (d *demo) del(ctx context.Context, p *pod) error {
	if err := p.cni.Del(ctx, p.rt); err != nil {
		return fmt.Errorf("DEL %s: %w", p.Name, err)
	}
	p.attached = false
	return nil
}

// serve starts a TCP server answering with the pod's name on every address.
func (d *demo) serve(p *pod) error {
	// The wildcard listener is dual-stack and survives re-addressing.
	stop, err := harness.Serve(p.NS, netip.IPv6Unspecified(), servePort, p.Name)
	if err != nil {
		return err
	}
	d.stops = append(d.stops, stop)
	return nil
}

// talk dials dst from inside from and expects dst's server to answer.
func talk(from ns.NetNS, dst netip.Addr, want string) error {
	if !dst.IsValid() {
		return errors.New("no address of this family")
	}
	got, err := harness.Dial(from, dst, servePort)
	if err != nil {
		return err
	}
	if got != want {
		return fmt.Errorf("%v answered %q, want %q", dst, got, want)
	}
	return nil
}

// nodeVeths lists the veths in the node netns other than its uplink:
// Coordino's cdo* and any the bridge plugin made.
func (d *demo) nodeVeths() ([]string, error) {
	var out []string
	err := d.node.NS.Do(func(ns.NetNS) error {
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		for _, l := range links {
			if l.Type() == "veth" && !strings.HasPrefix(l.Attrs().Name, "uplink0") {
				out = append(out, l.Attrs().Name)
			}
		}
		return nil
	})
	return out, err
}

// metricSamples parses the daemon's /metrics lines for name into
// label-string → value, e.g. `block="10.244.1.0/24",state="used"` → 3.
func (d *demo) metricSamples(name string) (map[string]float64, error) {
	code, body, err := d.node.HTTPGet("/metrics")
	if err != nil {
		return nil, err
	}
	if code != 200 {
		return nil, fmt.Errorf("/metrics answered %d", code)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, name)
		if !ok || rest == "" || (rest[0] != '{' && rest[0] != ' ') {
			continue
		}
		labels := ""
		if rest[0] == '{' {
			end := strings.LastIndexByte(rest, '}')
			labels, rest = rest[1:end], rest[end+1:]
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
		if err != nil {
			return nil, fmt.Errorf("metric line %q: %w", line, err)
		}
		out[labels] = v
	}
	return out, nil
}

// leases lists host-local's reservations for the chained network.
func (d *demo) leases() []string {
	entries, _ := os.ReadDir(filepath.Join(d.dir, "host-local", chainedNet))
	var out []string
	for _, e := range entries {
		if _, err := netip.ParseAddr(e.Name()); err == nil {
			out = append(out, e.Name())
		}
	}
	return out
}

// teardown DELs every attachment, stops servers and the daemon, and removes
// namespaces, pins, the bpffs dir and the scratch dir. With report it proves,
// on screen, that nothing is left; otherwise it is a quiet best effort for
// early exits.
func (d *demo) teardown(report bool) error {
	d.torn = true
	u := d.ui
	// The tour's context may be cancelled by now (Ctrl-C); cleanup gets its own.
	ctx, cancel := context.WithTimeout(context.Background(), cleanupLimit)
	defer cancel()
	var errs []error
	if d.node != nil && d.node.DaemonPID() != 0 {
		for _, p := range d.pods {
			if p.attached {
				start := time.Now()
				err := d.del(ctx, p)
				if report {
					u.check(err, "DEL %-6s %s", p.Name, ms(time.Since(start)))
				} else if err != nil {
					errs = append(errs, err)
				}
			}
		}
	}
	if report {
		d.reportLeftovers()
	}
	for _, stop := range d.stops {
		stop()
	}
	d.stops = nil
	var nsPaths []string
	for _, p := range d.pods {
		if p.NS != nil {
			nsPaths = append(nsPaths, p.NS.Path())
		}
		p.Close()
	}
	pid, bpfDir := 0, ""
	if d.node != nil {
		pid, bpfDir = d.node.DaemonPID(), d.node.BPFDir
		nsPaths = append(nsPaths, d.node.NS.Path())
		d.node.Close()
	}
	if d.dir != "" {
		if err := os.RemoveAll(d.dir); err != nil {
			errs = append(errs, fmt.Errorf("remove %s: %w", d.dir, err))
		}
	}
	if err := d.verifyGone(pid, bpfDir, nsPaths); err != nil {
		errs = append(errs, err)
	}
	if report {
		u.check(errors.Join(errs...), "removed: daemon stopped, %d netns deleted, 0 mounts, bpffs dir and scratch dir gone", len(nsPaths))
		return nil
	}
	if len(errs) == 0 {
		u.printf("   cleaned up: no namespaces, mounts, processes or files left\n")
	}
	return errors.Join(errs...)
}

// reportLeftovers counts what Coordino (and the bridge plugin) would leak.
func (d *demo) reportLeftovers() {
	var errs []error
	veths, err := d.nodeVeths()
	errs = append(errs, err)
	pins, err := d.node.Pins()
	errs = append(errs, err)
	used, err := d.node.Metric("coordino_ipam_addresses", `state="used"`)
	errs = append(errs, err)
	eps, err := d.node.Metric("coordino_endpoints")
	errs = append(errs, err)
	queued, _ := deletequeue.Paths(filepath.Join(d.node.RunDir, "delete-queue"))
	leases := d.leases()
	if err := errors.Join(errs...); err != nil {
		d.ui.check(err, "count leftovers")
		return
	}
	var leak error
	if len(veths)+len(pins)+int(used)+int(eps)+len(queued)+len(leases) != 0 {
		leak = fmt.Errorf("veths %v, pins %v, queued DELs %v, host-local leases %v", veths, pins, queued, leases)
	}
	d.ui.check(leak, "nothing left: %d veths, %d pins, %d addresses, %d endpoints, %d host-local leases, %d queued DELs",
		len(veths), len(pins), int(used), int(eps), len(leases), len(queued))
}

// verifyGone checks the kernel and filesystem really dropped what the demo made.
func (d *demo) verifyGone(pid int, bpfDir string, nsPaths []string) error {
	var errs []error
	if pid != 0 {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			errs = append(errs, fmt.Errorf("daemon pid %d still exists", pid))
		}
	}
	for _, p := range append(nsPaths, bpfDir, d.dir) {
		if p == "" {
			continue
		}
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("%s still exists", p))
		}
	}
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	for _, line := range strings.Split(string(mounts), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 5 {
			continue
		}
		mp := fields[4]
		for _, p := range append(nsPaths, d.dir) {
			if p != "" && (mp == p || strings.HasPrefix(mp, p+"/")) {
				errs = append(errs, fmt.Errorf("still mounted: %s", mp))
			}
		}
	}
	return errors.Join(errs...)
}

// ms renders a duration for people: milliseconds, or seconds from 1 s on.
func ms(d time.Duration) string {
	if d >= time.Second {
		return fmt.Sprintf("%.2f s", d.Seconds())
	}
	return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000)
}
