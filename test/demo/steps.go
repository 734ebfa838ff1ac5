package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/coordino/coordino/daemon/ipam"
	"github.com/coordino/coordino/plugin"
	"github.com/coordino/coordino/proto/deletequeue"
	"github.com/coordino/coordino/test/harness"
)

// Step 1.
func (d *demo) startNode() error {
	u := d.ui
	u.step(1, "Start a node", "every node runs one coordino-daemon; the CNI binary is only a thin client of it")
	dir, err := os.MkdirTemp("", "coordino-demo-")
	if err != nil {
		return err
	}
	d.dir = dir
	n, err := harness.NewNode(dir, nodeName, harness.NodeOptions{PodCIDRs: []string{podCIDR4, podCIDR6}})
	if err != nil {
		return err
	}
	d.node = n
	u.info("node netns %s, underlay %s and 2001:db8::1 on uplink0", shortNS(n.NS.Path()), n.NodeIP)
	u.info("pod CIDRs (dual-stack): %s and %s", podCIDR4, podCIDR6)
	u.detail("DEMO=%s", dir)
	for _, l := range wrapArgs(append([]string{"$ nsenter --net=" + n.NS.Path(), "--", "coordino-daemon"}, n.DaemonArgs()...), dir, 74) {
		u.detail("%s", l)
	}
	start := time.Now()
	if err := n.StartDaemon(); err != nil {
		return err
	}
	u.check(nil, "daemon pid %d serving on $DEMO/run/coordino.sock after %s", n.DaemonPID(), ms(time.Since(start)))
	code, _, err := n.HTTPGet("/readyz")
	if err == nil && code != 200 {
		err = fmt.Errorf("/readyz answered %d", code)
	}
	u.check(err, "/readyz answers 200")
	return nil
}

// wrapArgs renders a command line a few flags per line, with dir shortened to $DEMO.
func wrapArgs(args []string, dir string, width int) []string {
	var lines []string
	cur := ""
	for i := 0; i < len(args); i++ {
		tok := strings.ReplaceAll(args[i], dir, "$DEMO")
		// Keep a flag and its value together.
		if strings.HasPrefix(tok, "--") && i+1 < len(args) && !strings.HasPrefix(args[i+1], "--") && !strings.Contains(tok, "=") {
			i++
			tok += " " + strings.ReplaceAll(args[i], dir, "$DEMO")
		}
		if cur != "" && len(cur)+1+len(tok) > width {
			lines = append(lines, cur+" \\")
			cur = "    "
		} else if cur != "" {
			cur += " "
		}
		cur += tok
	}
	return append(lines, cur)
}

// Step 2.
func (d *demo) attachPods() error {
	u := d.ui
	u.step(2, "Attach three pods (primary mode)", "this is what kubelet's runtime does for every pod: CNI ADD through libcni")
	conf := d.node.PrimaryConflist(primaryNet, "1.1.0")
	c, err := d.node.NewCNI(conf)
	if err != nil {
		return err
	}
	d.primary = c
	u.detail("conflist: %s", d.compact(conf))
	u.printf("\n")
	var rows [][]string
	seen := map[netip.Addr]bool{}
	var bad []string
	for _, name := range []string{"web", "api", "db"} {
		p, err := d.newPod(c, name)
		if err != nil {
			return err
		}
		if err := d.add(p); err != nil {
			return err
		}
		rows = append(rows, podRow(p))
		for _, a := range p.addrs {
			in := netip.MustParsePrefix(podCIDR4).Contains(a) || netip.MustParsePrefix(podCIDR6).Contains(a)
			if seen[a] || !in {
				bad = append(bad, a.String())
			}
			seen[a] = true
		}
		if !p.v4().IsValid() || !p.v6().IsValid() {
			bad = append(bad, name+" is not dual-stack")
		}
	}
	u.table([]string{"POD", "NETNS", "IF", "IPv4", "IPv6", "HOST VETH", "ADD"}, rows)
	u.printf("\n")
	var err2 error
	if len(bad) > 0 {
		err2 = fmt.Errorf("duplicate, foreign or missing addresses: %v", bad)
	}
	u.check(err2, "3 pods, 6 distinct addresses, all inside the node's pod CIDRs")
	return nil
}

// compact renders JSON on one line, with the scratch dir shortened to $DEMO.
func (d *demo) compact(doc []byte) string {
	var b bytes.Buffer
	if err := json.Compact(&b, doc); err != nil {
		return string(doc)
	}
	return strings.ReplaceAll(b.String(), d.dir, "$DEMO")
}

func podRow(p *pod) []string {
	v4, v6 := "—", "—"
	if a := p.v4(); a.IsValid() {
		v4 = a.String()
	}
	if a := p.v6(); a.IsValid() {
		v6 = a.String()
	}
	return []string{p.Name, shortNS(p.rt.NetNS), p.rt.IfName, v4, v6, p.hostVeth, ms(p.took)}
}

// shortNS abbreviates a netns path to its recognisable start.
func shortNS(path string) string {
	name := filepath.Base(path)
	if len(name) > 16 {
		return name[:16] + "…"
	}
	return name
}

// Step 3.
func (d *demo) connectivity() error {
	u := d.ui
	u.step(3, "Connectivity", "pods must reach each other over both families, and the node must reach pods (kubelet probes)")
	pods := []*pod{d.byName["web"], d.byName["api"], d.byName["db"]}
	for _, p := range pods {
		if err := d.serve(p); err != nil {
			return err
		}
	}
	u.info("each pod serves its name on TCP :%d; every source dials every pod over IPv4 and IPv6", servePort)
	u.printf("\n")
	type source struct {
		name string
		ns   ns.NetNS
	}
	sources := []source{}
	for _, p := range pods {
		sources = append(sources, source{p.Name, p.NS})
	}
	sources = append(sources, source{"node", d.node.NS})
	header := []string{"FROM \\ TO"}
	for _, p := range pods {
		header = append(header, p.Name)
	}
	var rows [][]string
	var failures []error
	good, total := 0, 0
	for _, s := range sources {
		row := []string{s.name}
		for _, dst := range pods {
			if s.name == dst.Name {
				row = append(row, "·")
				continue
			}
			cell := ""
			for _, fam := range []struct {
				label string
				addr  netip.Addr
			}{{"v4", dst.v4()}, {"v6", dst.v6()}} {
				err := talk(s.ns, fam.addr, dst.Name)
				total++
				if err == nil {
					good++
				} else {
					failures = append(failures, fmt.Errorf("%s → %s %s (%v): %w", s.name, dst.Name, fam.label, fam.addr, err))
				}
				cell += fam.label + " " + u.mark(err == nil) + "  "
			}
			row = append(row, strings.TrimSpace(cell))
		}
		rows = append(rows, row)
	}
	u.table(header, rows)
	u.printf("\n")
	u.check(errors.Join(failures...), "%d/%d TCP connections answered by the right pod", good, total)
	return nil
}

// Step 4.
func (d *demo) checkBreakRepair() error {
	u := d.ui
	u.step(4, "CHECK, break, repair", "runtimes call CHECK to ask \"is this pod's network still as you made it?\"; the answer must be precise")
	for _, name := range []string{"web", "api", "db"} {
		p := d.byName[name]
		u.check(p.cni.Check(d.ctx, p.rt), "CHECK %s", name)
	}
	web := d.byName["web"]
	dst := &net.IPNet{IP: web.v4().AsSlice(), Mask: net.CIDRMask(32, 32)}
	u.info("sabotage: in the node netns, delete web's host route")
	u.detail("$ ip route del %s dev %s", dst, web.hostVeth)
	if err := d.node.NS.Do(func(ns.NetNS) error {
		routes, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Dst: dst}, netlink.RT_FILTER_DST)
		if err != nil || len(routes) != 1 {
			return fmt.Errorf("host route to %v: %v %v", dst, routes, err)
		}
		return netlink.RouteDel(&routes[0])
	}); err != nil {
		return fmt.Errorf("delete web's host route: %w", err)
	}
	err := web.cni.Check(d.ctx, web.rt)
	var verdict error
	switch {
	case err == nil:
		verdict = errors.New("CHECK passed although the route is gone")
	case !strings.Contains(err.Error(), web.v4().String()) || !strings.Contains(err.Error(), "route"):
		verdict = fmt.Errorf("CHECK failed but does not name the route to %v: %v", web.v4(), err)
	default:
		u.detail("CHECK web → %v", err)
	}
	u.check(verdict, "CHECK web now fails and names the missing route")
	u.info("repair the way a runtime would: DEL, then ADD again")
	if err := d.del(d.ctx, web); err != nil {
		return err
	}
	if err := d.add(web); err != nil {
		return err
	}
	u.info("web is back on %v and %v (ADD %s)", web.v4(), web.v6(), ms(web.took))
	u.check(web.cni.Check(d.ctx, web.rt), "CHECK web passes again")
	u.check(talk(d.byName["api"].NS, web.v4(), "web"), "api → web over IPv4 again")
	return nil
}

// Step 5.
func (d *demo) chainedMode() error {
	u := d.ui
	u.step(5, "Chained mode: bridge + host-local, then Coordino", "on clusters that keep their CNI, Coordino adds policy and observability without touching addressing")
	dataDir := filepath.Join(d.dir, "host-local")
	// bridge + host-local make the interface and address; Coordino follows.
	conf := []byte(fmt.Sprintf(`{"cniVersion":"1.1.0","name":%q,"plugins":[
		{"type":"bridge","bridge":%q,"isGateway":true,
		 "ipam":{"type":"host-local","ranges":[[{"subnet":%q}]],"routes":[{"dst":"0.0.0.0/0"}],"dataDir":%q}},
		{"type":"coordino","runDir":%q}]}`, chainedNet, bridgeName, chainedCIDR, dataDir, d.node.RunDir))
	u.detail("conflist: %s", d.compact(conf))
	u.printf("\n")
	c, err := d.node.NewCNI(conf)
	if err != nil {
		return err
	}
	cdoBefore, err := d.node.HostVeths()
	if err != nil {
		return err
	}
	p, err := d.newPod(c, "cache")
	if err != nil {
		return err
	}
	if err := d.add(p); err != nil {
		// Teardown DELs the pod, undoing whatever bridge did.
		u.warn("chained mode is not working yet; the tour goes on without it", err)
		return nil
	}
	d.chained = c
	u.table([]string{"POD", "NETNS", "IF", "IPv4", "IPv6", "HOST VETH", "ADD"}, [][]string{podRow(p)})
	u.printf("\n")

	lease, err := os.ReadFile(filepath.Join(dataDir, chainedNet, p.v4().String()))
	var fromHostLocal error
	switch {
	case !netip.MustParsePrefix(chainedCIDR).Contains(p.v4()):
		fromHostLocal = fmt.Errorf("address %v is outside host-local's range %s", p.v4(), chainedCIDR)
	case err != nil:
		fromHostLocal = fmt.Errorf("no host-local lease for %v: %w", p.v4(), err)
	case !strings.HasPrefix(string(lease), p.ContainerID):
		fromHostLocal = fmt.Errorf("lease %v belongs to %q", p.v4(), lease)
	}
	u.check(fromHostLocal, "address %v came from host-local (lease $DEMO/host-local/%s/%s)", p.v4(), chainedNet, p.v4())

	var names []string
	for _, i := range p.result.Interfaces {
		names = append(names, i.Name)
	}
	var passed error
	if len(names) == 0 || names[0] != bridgeName || len(p.result.IPs) != 1 {
		passed = fmt.Errorf("final result is not bridge's: %s", harness.ResultJSON(p.result))
	}
	cdoAfter, err := d.node.HostVeths()
	if err == nil && len(cdoAfter) != len(cdoBefore) {
		err = fmt.Errorf("Coordino made interfaces of its own: %v → %v", cdoBefore, cdoAfter)
	}
	u.check(errors.Join(passed, err), "prevResult passed through untouched: interfaces %s, no cdo* veth added", strings.Join(names, ", "))
	chained, err := d.node.Metric("coordino_endpoints", `mode="chained"`)
	if err == nil && chained != 1 {
		err = fmt.Errorf("coordino_endpoints{mode=\"chained\"} = %v", chained)
	}
	u.check(err, "Coordino registered the endpoint on %s (coordino_endpoints{mode=\"chained\"} 1)", p.hostVeth)
	if err := d.serve(p); err != nil {
		return err
	}
	u.check(talk(d.node.NS, p.v4(), "cache"), "node → cache over IPv4 (via %s)", bridgeName)
	u.check(talk(p.NS, d.byName["api"].v4(), "api"), "cache → api over IPv4 (bridge pod to Coordino pod)")
	u.check(c.Check(d.ctx, p.rt), "CHECK cache (bridge, then Coordino)")
	return nil
}

// Step 6.
func (d *demo) daemonRestart() error {
	u := d.ui
	u.step(6, "Daemon crash and restart", "upgrading or crashing the daemon must not cut pods off, and kubelet's DELs must never hang")
	web, api, db := d.byName["web"], d.byName["api"], d.byName["db"]
	pid := d.node.DaemonPID()
	if err := d.node.StopDaemon(syscall.SIGKILL); err != nil {
		return err
	}
	u.check(nil, "daemon pid %d killed with SIGKILL", pid)
	u.check(talk(web.NS, api.v4(), "api"), "web → api over IPv4, daemon down")
	u.check(talk(api.NS, web.v6(), "web"), "api → web over IPv6, daemon down")
	u.check(talk(d.node.NS, db.v4(), "db"), "node → db over IPv4, daemon down")

	start := time.Now()
	err := d.del(d.ctx, db)
	took := time.Since(start)
	if err == nil && took > 2*time.Second {
		err = fmt.Errorf("took %v", took)
	}
	u.check(err, "DEL db returned in %s although the daemon is down", ms(took))
	queued, _ := deletequeue.Paths(filepath.Join(d.node.RunDir, "delete-queue"))
	var qerr error
	if len(queued) != 1 {
		qerr = fmt.Errorf("delete queue holds %v", queued)
	}
	u.check(qerr, "the DEL waits in the on-disk queue: %d file(s)", len(queued))
	for _, q := range queued {
		u.detail("%s", strings.ReplaceAll(q, d.dir, "$DEMO"))
	}
	db.Close() // the runtime removes the sandbox; the pin keeps its netns until the DEL is applied

	late, err := d.newPod(d.primary, "late")
	if err != nil {
		return err
	}
	u.info("a new pod arrives meanwhile; the plugin keeps trying the daemon for up to %v…", plugin.ConnectTimeout)
	start = time.Now()
	err = d.add(late)
	took = time.Since(start)
	var ce *types.Error
	var refused error
	switch {
	case err == nil:
		refused = errors.New("ADD succeeded without a daemon")
	case !errors.As(err, &ce) || ce.Code != types.ErrTryAgainLater:
		refused = fmt.Errorf("want CNI error %d (try again later), got %w", types.ErrTryAgainLater, err)
	default:
		u.detail("ADD late → error %d: %s", ce.Code, strings.ReplaceAll(ce.Msg, d.dir, "$DEMO"))
	}
	u.check(refused, "ADD late refused after %s with CNI error 11 (try again later): the runtime will retry", ms(took))

	start = time.Now()
	if err := d.node.StartDaemon(); err != nil {
		return err
	}
	u.check(nil, "daemon restarted as pid %d, serving after %s", d.node.DaemonPID(), ms(time.Since(start)))
	queued, _ = deletequeue.Paths(filepath.Join(d.node.RunDir, "delete-queue"))
	veths, verr := d.node.HostVeths()
	pins, perr := d.node.Pins()
	used, merr := d.node.Metric("coordino_ipam_addresses", `state="used"`)
	applied := errors.Join(verr, perr, merr)
	if applied == nil && (len(queued) != 0 || contains(veths, db.hostVeth) || contains(pins, db.hostVeth) || used != 4) {
		applied = fmt.Errorf("queue %v, veths %v, pins %v, %v addresses used", queued, veths, pins, used)
	}
	u.check(applied, "queued DEL applied at start-up: queue empty, %s and its pin gone, db's 2 addresses free", db.hostVeth)
	if err := d.add(late); err != nil {
		u.check(err, "the runtime retries ADD late")
	} else {
		u.check(nil, "the runtime retries: ADD late succeeds now (%v, %v, %s)", late.v4(), late.v6(), ms(late.took))
	}
	u.check(web.cni.Check(d.ctx, web.rt), "CHECK web after the restart")
	u.check(talk(web.NS, api.v6(), "api"), "web → api over IPv6 after the restart")
	return nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// Step 7.
func (d *demo) garbageCollect() error {
	u := d.ui
	u.step(7, "Garbage collection", "a runtime that lost track of sandboxes (crash, state wipe) must not leak addresses forever")
	// A runtime "incarnation" with its own cache attaches two pods, then
	// forgets them: their netns are gone, nobody will ever DEL them.
	lost, err := d.node.NewCNI(d.node.PrimaryConflist(primaryNet, "1.1.0"))
	if err != nil {
		return err
	}
	var stale []*pod
	for _, name := range []string{"job-1", "job-2"} {
		p, err := d.newPod(lost, name)
		if err != nil {
			return err
		}
		if err := d.add(p); err != nil {
			return err
		}
		stale = append(stale, p)
		u.info("%s attached (%v, %s), then its runtime forgot it", name, p.v4(), p.hostVeth)
	}
	for _, p := range stale {
		p.Close()
	}
	before, _ := d.node.Metric("coordino_endpoints", `mode="primary"`)
	valid := []types.GCAttachment{}
	var names []string
	for _, name := range []string{"web", "api", "late"} {
		p := d.byName[name]
		valid = append(valid, types.GCAttachment{ContainerID: p.ContainerID, IfName: p.rt.IfName})
		names = append(names, name)
	}
	u.info("GC on network %q; the runtime's valid attachments: %s", primaryNet, strings.Join(names, ", "))
	start := time.Now()
	if err := d.primary.GC(d.ctx, valid); err != nil {
		u.check(err, "GC")
		return nil
	}
	took := time.Since(start)
	for _, p := range stale {
		p.attached = false
	}
	veths, verr := d.node.HostVeths()
	pins, perr := d.node.Pins()
	used, uerr := d.node.Metric("coordino_ipam_addresses", `state="used"`)
	after, aerr := d.node.Metric("coordino_endpoints", `mode="primary"`)
	reclaimed := errors.Join(verr, perr, uerr, aerr)
	for _, p := range stale {
		if reclaimed == nil && (contains(veths, p.hostVeth) || contains(pins, p.hostVeth)) {
			reclaimed = fmt.Errorf("%s's %s survived GC (veths %v, pins %v)", p.Name, p.hostVeth, veths, pins)
		}
	}
	if reclaimed == nil && (used != 6 || after != 3) {
		reclaimed = fmt.Errorf("%v addresses used, %v primary endpoints after GC", used, after)
	}
	u.check(reclaimed, "GC (%s) reclaimed job-1 and job-2: endpoints %v → %v, 2 veths, 2 pins, 4 addresses", ms(took), before, after)
	for _, name := range []string{"web", "api", "late"} {
		p := d.byName[name]
		u.check(p.cni.Check(d.ctx, p.rt), "CHECK %s: valid attachment untouched", name)
	}
	if d.chained != nil {
		cache := d.byName["cache"]
		u.check(cache.cni.Check(d.ctx, cache.rt), "CHECK cache: network %q was not GC's business", chainedNet)
	}
	return nil
}

// Step 8.
func (d *demo) metrics() error {
	u := d.ui
	u.step(8, "Metrics", "operators watch CNI latency, address exhaustion and endpoint counts on every node")
	u.info("from the daemon's /metrics (counters restarted with the daemon in step 6)")
	u.printf("\n")
	counts, err := d.metricSamples("coordino_cni_request_duration_seconds_count")
	if err != nil {
		return err
	}
	sums, err := d.metricSamples("coordino_cni_request_duration_seconds_sum")
	if err != nil {
		return err
	}
	var rows [][]string
	for _, verb := range []string{"ADD", "DEL", "CHECK", "GC", "STATUS"} {
		// Summed over result codes.
		var n, sum float64
		ok := false
		for labels, v := range counts {
			if labelValue(labels, "verb") == verb {
				n, sum, ok = n+v, sum+sums[labels], true
			}
		}
		if !ok {
			continue
		}
		mean := "—"
		if n > 0 {
			mean = fmt.Sprintf("%.2f ms", sum/n*1000)
		}
		rows = append(rows, []string{verb, fmt.Sprintf("%.0f", n), fmt.Sprintf("%.2f ms", sum*1000), mean})
	}
	u.table([]string{"VERB", "COUNT", "SUM", "MEAN"}, rows)
	u.printf("\n")

	usage, err := d.metricSamples("coordino_ipam_addresses")
	if err != nil {
		return err
	}
	type block struct{ used, free float64 }
	blocks := map[string]*block{}
	for labels, v := range usage {
		b := labelValue(labels, "block")
		if blocks[b] == nil {
			blocks[b] = &block{}
		}
		if labelValue(labels, "state") == "used" {
			blocks[b].used = v
		} else {
			blocks[b].free = v
		}
	}
	var names []string
	for b := range blocks {
		names = append(names, b)
	}
	sort.Strings(names)
	rows = nil
	for _, b := range names {
		rows = append(rows, []string{b, fmt.Sprintf("%.0f", blocks[b].used), fmt.Sprintf("%.0f", blocks[b].free)})
	}
	u.table([]string{"IPAM BLOCK", "USED", "FREE"}, rows)
	u.detail("(a block's bitmap holds at most %d addresses, so a /64 counts as that many)", ipam.MaxBlockAddresses)
	u.printf("\n")

	eps, err := d.metricSamples("coordino_endpoints")
	if err != nil {
		return err
	}
	u.info("endpoints: primary %.0f, chained %.0f", eps[`mode="primary"`], eps[`mode="chained"`])
	wantChained := 0.0
	if d.chained != nil {
		wantChained = 1
	}
	var verr error
	if counts[`code="0",verb="ADD"`] < 2 || eps[`mode="primary"`] != 3 || eps[`mode="chained"`] != wantChained ||
		blocks[podCIDR4] == nil || blocks[podCIDR4].used != 3 || blocks[podCIDR4].free != 251 {
		verr = fmt.Errorf("ADD count %v, endpoints %v, %s %+v", counts[`code="0",verb="ADD"`], eps, podCIDR4, blocks[podCIDR4])
	}
	u.check(verr, "metrics agree with the node: 3 primary pods, %.0f chained, %s 3 used / 251 free", wantChained, podCIDR4)
	return nil
}

// labelValue extracts key's value from a `k="v",k2="v2"` label string.
func labelValue(labels, key string) string {
	for _, kv := range strings.Split(labels, ",") {
		if k, v, ok := strings.Cut(kv, "="); ok && k == key {
			return strings.Trim(v, `"`)
		}
	}
	return ""
}

// Step 9.
func (d *demo) cleanUp() error {
	d.ui.step(9, "Clean up", "a CNI that leaks veths, mounts or addresses slowly breaks the node it runs on")
	return d.teardown(true)
}
