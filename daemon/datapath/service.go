package datapath

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/coordino/coordino/bpf"
	"github.com/coordino/coordino/daemon/kernel"
	"github.com/coordino/coordino/daemon/postdnat"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// cfgServiceHook and cfgServiceMatch are CFG_SERVICE_HOOK and
// CFG_SERVICE_MATCH of bpf/coordino.h; svcMarks are its MARK_SVC_* bits.
const (
	cfgServiceHook  = 2
	cfgServiceMatch = 8
	svcMarks        = 0x00200000 | 0x00400000 | 0x00800000
)

// ServiceStage names what decides Service traffic of egress-isolated pods
// after DNAT.
type ServiceStage string

const (
	// ServiceStageNetfilter is the BPF netfilter program (kernel 6.4+).
	ServiceStageNetfilter ServiceStage = "bpf-netfilter"
	// ServiceStageNftables is the nftables chain with the xtables BPF
	// match (daemon/postdnat), for older kernels.
	ServiceStageNftables ServiceStage = "nftables-xt-bpf"
	// ServiceStageNone: such flows are dropped (fail closed), or there are
	// no Service CIDRs to defer.
	ServiceStageNone ServiceStage = "none"
)

// servicePriorities run the post-DNAT program right after kube-proxy's DNAT
// (NF_IP_PRI_NAT_DST, -100, the priority of iptables' nat PREROUTING and of
// nftables' "dstnat"), before filtering and routing. The kernel refuses a
// second BPF program at a priority taken, so a restarting daemon attaches
// at the other one before it unpins its predecessor's: no gap.
var servicePriorities = []int32{-100 + 1, -100 + 2}

// serviceHooks are the netfilter hooks of the post-DNAT program, by pin name.
var serviceHooks = []struct {
	pin    string
	family link.NetfilterProtocolFamily
}{
	{"service-ipv4", link.NetfilterProtoIPv4},
	{"service-ipv6", link.NetfilterProtoIPv6},
}

// ErrServiceHookDisabled is the reason the datapath gives when the post-DNAT
// hook is off by configuration (Config.NoServiceHook).
var ErrServiceHookDisabled = errors.New("post-DNAT hook disabled by configuration")

var errNoServiceCIDRs = errors.New("no Service CIDRs configured (--service-cidrs)")

// services is the post-DNAT stage's part: the Service CIDRs (cdo_svc_cidrs),
// the stage attached (BPF netfilter program or nftables chain) and its pins.
// The config flags that tell the tc programs to defer to the stage are the
// map writer's; setup is given the function that writes them.
type services struct {
	// mu guards cidrs, hookErr and stage: SetServiceCIDRs changes them
	// while packets' verdicts are explained.
	mu    sync.RWMutex
	cidrs []netip.Prefix
	// nodePorts are the deferred node ports (UpdateNodePorts), as written
	// in nodePortMap (cdo_svc_nodeports) and the nftables stage's sets.
	nodePorts   map[NodePort]bool
	nodePortMap *ebpf.Map
	disabled    bool // Config.NoServiceHook
	tiers       bool // as the tc programs: they decide the ClusterNetworkPolicy tiers
	features    *kernel.Features
	links       string // <BPFDir>/links
	// shared are the tc object's maps, which the stage's programs use too.
	shared  *bpf.CoordinoMaps
	cidrMap *ebpf.Map
	ct      *conntrack
	log     *zap.Logger

	// hookErr is why the post-DNAT stage is not attached (nil: it is);
	// stage is the one attached.
	hookErr error
	stage   ServiceStage
	// setFlags writes the tc programs' config flags (the map writer's).
	setFlags func(mask, set uint32) error
}

// setup writes the Service CIDRs and attaches the post-DNAT stage
// the kernel offers (Config.Features): the BPF netfilter program
// (bpf/coordino_svc.c), else the nftables chain running the xtables BPF
// match (bpf/coordino_svcmatch.c). Where neither can be had, the tc
// programs drop Service traffic of egress-isolated pods instead (fail
// closed); the error says why. Only an error writing the maps fails Open.
func (sv *services) setup(setFlags func(mask, set uint32) error) error {
	sv.mu.Lock()
	defer sv.mu.Unlock()
	sv.setFlags = setFlags
	if err := sv.adoptNodePorts(); err != nil {
		return err
	}
	return sv.setupLocked()
}

// SetServiceCIDRs replaces the Service CIDRs (the Kubernetes mode's
// ServiceCIDR objects, with the flag's): the map, the stage and the flags
// are set up again as at Open, which attaches the new stage before the
// old one goes.
func (d *Datapath) SetServiceCIDRs(cidrs []netip.Prefix) error {
	sv := d.svc
	sv.mu.Lock()
	defer sv.mu.Unlock()
	sorted := func(ps []netip.Prefix) []netip.Prefix {
		out := make([]netip.Prefix, 0, len(ps))
		for _, p := range ps {
			if !slices.Contains(out, p.Masked()) {
				out = append(out, p.Masked())
			}
		}
		slices.SortFunc(out, func(a, b netip.Prefix) int { return strings.Compare(a.String(), b.String()) })
		return out
	}
	if slices.Equal(sorted(cidrs), sorted(sv.cidrs)) {
		return nil
	}
	sv.cidrs = sorted(cidrs)
	return sv.setupLocked()
}

// setupLocked is setup; callers hold mu.
func (sv *services) setupLocked() error {
	setFlags := sv.setFlags
	if err := sv.writeServiceCIDRs(sv.cidrs); err != nil {
		return err
	}
	stage, hookErr := ServiceStageNone, ErrServiceHookDisabled
	switch {
	case len(sv.cidrs) == 0 && len(sv.nodePorts) == 0:
		// Nothing is deferred: spare every packet of isolated pods the hook.
		hookErr = errNoServiceCIDRs
	case !sv.disabled:
		stage, hookErr = sv.attachServiceStage()
	}
	var flags uint32
	switch stage {
	case ServiceStageNetfilter:
		flags = cfgServiceHook
	case ServiceStageNftables:
		flags = cfgServiceHook | cfgServiceMatch
	}
	if err := setFlags(cfgServiceHook|cfgServiceMatch, flags); err != nil {
		return fmt.Errorf("datapath: write config: %w", err)
	}
	// Only now that the tc programs defer to this stage (or no longer
	// defer): a previous daemon's other stage goes, so what runs matches
	// this kernel and configuration.
	if stage != ServiceStageNetfilter {
		sv.unpinServiceHook()
	}
	if stage != ServiceStageNftables {
		if err := postdnat.Remove(); err != nil {
			sv.log.Warn("stale nftables post-DNAT stage not removed", zap.Error(err))
		}
	}
	sv.hookErr, sv.stage = hookErr, stage
	switch {
	case hookErr == nil:
		sv.log.Info("Service traffic is decided after kube-proxy's DNAT",
			zap.String("stage", string(stage)), zap.Stringers("serviceCIDRs", sv.cidrs))
	case len(sv.cidrs) > 0:
		sv.log.Error("post-DNAT stage unavailable: new flows from egress-isolated pods to Service CIDRs are DROPPED (fail closed); needs BPF netfilter links (kernel >= 6.4) or nftables with the xtables BPF match (nf_tables, nft_compat, xt_bpf)",
			zap.Stringers("serviceCIDRs", sv.cidrs), zap.Error(hookErr))
	default:
		sv.log.Info("post-DNAT hook not attached: Service traffic is judged on the Service address", zap.Error(hookErr))
	}
	return nil
}

// attachServiceStage attaches the first post-DNAT stage the kernel offers.
func (sv *services) attachServiceStage() (ServiceStage, error) {
	var errs []error
	f := sv.features
	if f.Has(kernel.NetfilterLink) && f.Has(kernel.DynptrFromSkb) {
		err := sv.attachServiceHook()
		if err == nil {
			return ServiceStageNetfilter, nil
		}
		errs = append(errs, err)
	} else {
		errs = append(errs, errors.New("the kernel has no BPF netfilter links (6.4+)"))
	}
	if f.Has(kernel.XTBPFMatch) {
		err := sv.attachServiceMatch()
		if err == nil {
			return ServiceStageNftables, nil
		}
		errs = append(errs, err)
	} else {
		errs = append(errs, errors.New("the kernel has no nftables xtables BPF match (nf_tables, nft_compat, xt_bpf)"))
	}
	return ServiceStageNone, errors.Join(errs...)
}

// attachServiceMatch loads the match program on the tc object's maps and
// installs (or, after a restart, replaces in one transaction) the nftables
// chains that run it.
func (sv *services) attachServiceMatch() error {
	load := bpf.LoadCoordinoSvcmatch
	if !sv.tiers {
		load = bpf.LoadCoordinoSvcmatchNotiers // as the tc programs (datapath.Open)
	}
	spec, err := load()
	if err != nil {
		return fmt.Errorf("load nftables post-DNAT spec: %w", err)
	}
	objs := new(bpf.CoordinoSvcmatchPrograms)
	if err := sv.loadOnSharedMaps(spec, objs); err != nil {
		return fmt.Errorf("load nftables post-DNAT program: %w", err)
	}
	defer objs.Close()
	nps := make([]NodePort, 0, len(sv.nodePorts))
	for np := range sv.nodePorts {
		nps = append(nps, np)
	}
	return postdnat.Install(objs.CdoSvcMatch.FD(), sv.cidrs, nps, svcMarks)
}

// ServiceStage says what decides Service traffic after DNAT.
func (d *Datapath) ServiceStage() ServiceStage {
	stage, _ := d.svc.status()
	return stage
}

// ServiceHookError reports why the post-DNAT hook is not attached, or nil
// when it is.
func (d *Datapath) ServiceHookError() error {
	_, err := d.svc.status()
	return err
}

// status is the stage attached and, if none, why.
func (sv *services) status() (ServiceStage, error) {
	sv.mu.RLock()
	defer sv.mu.RUnlock()
	return sv.stage, sv.hookErr
}

// attachServiceHook loads the post-DNAT program on the tc object's maps and
// links it to PREROUTING for both families. The links are pinned, so a
// daemon restart keeps Service flows decided; the new links are attached
// before the old pins are replaced, so there is no gap.
func (sv *services) attachServiceHook() error {
	objs, err := sv.loadServiceProgram()
	if err != nil {
		return err
	}
	defer objs.Close()
	var links []link.Link
	defer func() {
		for _, l := range links {
			l.Close()
		}
	}()
	for _, h := range serviceHooks {
		var err error
		for _, prio := range servicePriorities {
			var l link.Link
			l, err = link.AttachNetfilter(link.NetfilterOptions{
				Program:        objs.CdoSvc,
				ProtocolFamily: h.family,
				Hook:           link.NetfilterInetPreRouting,
				Priority:       prio,
			})
			if err == nil {
				links = append(links, l)
				sv.log.Debug("post-DNAT hook attached", zap.String("hook", h.pin), zap.Int32("priority", prio))
				break
			}
			if !errors.Is(err, unix.EBUSY) {
				break
			}
		}
		if err != nil {
			return fmt.Errorf("attach post-DNAT program (family %d): %w", h.family, err)
		}
	}
	for i, h := range serviceHooks {
		pin := filepath.Join(sv.links, h.pin)
		tmp := pin + "-new"
		os.Remove(tmp)
		if err := links[i].Pin(tmp); err != nil {
			return fmt.Errorf("pin post-DNAT link: %w", err)
		}
		// rename over the old pin detaches the previous daemon's hook.
		if err := os.Rename(tmp, pin); err != nil {
			os.Remove(tmp)
			return fmt.Errorf("pin post-DNAT link: %w", err)
		}
	}
	return nil
}

// loadServiceProgram loads the post-DNAT program on the tc object's maps;
// the caller closes it.
func (sv *services) loadServiceProgram() (*bpf.CoordinoSvcPrograms, error) {
	spec, err := bpf.LoadCoordinoSvc()
	if err != nil {
		return nil, fmt.Errorf("load post-DNAT spec: %w", err)
	}
	objs := new(bpf.CoordinoSvcPrograms)
	if err := sv.loadOnSharedMaps(spec, objs); err != nil {
		return nil, fmt.Errorf("load post-DNAT program: %w", err)
	}
	return objs, nil
}

// loadOnSharedMaps loads a post-DNAT object's programs into objs, every
// map of it being the tc object's of the same name.
func (sv *services) loadOnSharedMaps(spec *ebpf.CollectionSpec, objs any) error {
	shared := sharedMaps(sv.shared)
	opts := &ebpf.CollectionOptions{MapReplacements: map[string]*ebpf.Map{}}
	// The stage decides as the tc programs do: a tiered endpoint's entries
	// read without the tiers would allow what a Deny denies.
	if err := spec.Variables["cdo_have_tiers"].Set(sv.tiers); err != nil {
		return fmt.Errorf("configure: %w", err)
	}
	// A map the program would get a private copy of silently decides on
	// empty state (e.g. no policy): refuse to load instead.
	for name, ms := range spec.Maps {
		if strings.HasPrefix(name, ".") {
			continue
		}
		m, ok := shared[name]
		if !ok {
			return fmt.Errorf("map %s is not shared with the tc programs", name)
		}
		// Sizes are flags (--ipcache-map-size, --conntrack-size, ...):
		// the spec takes the size of the map it shares, not the C default.
		ms.MaxEntries = m.MaxEntries()
		opts.MapReplacements[name] = m
	}
	if err := spec.LoadAndAssign(objs, opts); err != nil {
		var verr *ebpf.VerifierError
		if errors.As(err, &verr) {
			return fmt.Errorf("%+v", verr)
		}
		return err
	}
	return nil
}

// sharedMaps names the tc object's maps by their names in C (bpf2go's
// struct tags).
func sharedMaps(maps *bpf.CoordinoMaps) map[string]*ebpf.Map {
	out := map[string]*ebpf.Map{}
	v := reflect.ValueOf(maps).Elem()
	for i := range v.NumField() {
		if m, ok := v.Field(i).Interface().(*ebpf.Map); ok && m != nil {
			out[v.Type().Field(i).Tag.Get("ebpf")] = m
		}
	}
	return out
}

// unpinServiceHook detaches a post-DNAT hook a previous daemon pinned.
func (sv *services) unpinServiceHook() {
	for _, h := range serviceHooks {
		pin := filepath.Join(sv.links, h.pin)
		if err := os.Remove(pin); err != nil && !errors.Is(err, os.ErrNotExist) {
			sv.log.Warn("stale post-DNAT link not removed", zap.String("pin", pin), zap.Error(err))
		}
	}
}

// writeServiceCIDRs makes the Service CIDR map hold exactly cidrs.
func (sv *services) writeServiceCIDRs(cidrs []netip.Prefix) error {
	m := sv.cidrMap
	want := map[bpf.CoordinoIpcacheKey]bool{}
	for _, p := range cidrs {
		want[ipcacheKey(p.Masked())] = true
	}
	var (
		k     bpf.CoordinoIpcacheKey
		v     uint32
		stale []bpf.CoordinoIpcacheKey
	)
	it := m.Iterate()
	for it.Next(&k, &v) {
		if !want[k] {
			stale = append(stale, k)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("datapath: read Service CIDRs: %w", err)
	}
	for _, k := range stale {
		if err := m.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("datapath: remove Service CIDR: %w", err)
		}
	}
	for k := range want {
		if err := m.Update(&k, uint32(1), ebpf.UpdateAny); err != nil {
			return fmt.Errorf("datapath: write Service CIDR: %w", err)
		}
	}
	if len(stale) > 0 {
		sv.purgeServiceFlows()
	}
	return nil
}

// ctService is CT_SERVICE of bpf/coordino.h.
const ctService = 16

// purgeServiceFlows forgets Service flows to what is no longer deferred (a
// Service CIDR or node port withdrawn): the post-DNAT stage only looks at
// what is, so such a flow left pending would never be decided. Their next
// packet is judged anew. Callers hold mu.
func (sv *services) purgeServiceFlows() {
	err := sv.ct.purgeWhere(func(k *bpf.CoordinoCtKey, v *bpf.CoordinoCtEntry) bool {
		if v.Flags&ctService == 0 {
			return false
		}
		dst := netip.AddrFrom16(k.Dst)
		if k.Family == 4 {
			dst = netip.AddrFrom4([4]byte(k.Dst[:4]))
		}
		return !sv.containsLocked(dst) && !sv.nodePorts[NodePort{Addr: dst, Proto: k.Proto, Port: ntohs(k.Dport)}]
	})
	if err != nil {
		sv.log.Warn("purge of flows to former Service CIDRs and node ports incomplete: they stay pending until they expire", zap.Error(err))
	}
}

// ServiceAddress reports whether addr lies in a configured Service CIDR:
// new flows of egress-isolated pods to it are decided after DNAT.
func (d *Datapath) ServiceAddress(addr netip.Addr) bool {
	return d.svc.contains(addr)
}

func (sv *services) contains(addr netip.Addr) bool {
	sv.mu.RLock()
	defer sv.mu.RUnlock()
	return sv.containsLocked(addr)
}

// containsLocked is contains; callers hold mu.
func (sv *services) containsLocked(addr netip.Addr) bool {
	addr = addr.Unmap()
	for _, p := range sv.cidrs {
		if p.Contains(addr) {
			return true
		}
	}
	return false
}
