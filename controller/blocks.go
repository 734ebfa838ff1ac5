package controller

import (
	"context"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"sort"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
)

// Block life cycle (each step one API write, each safe to repeat after a
// crash or by another controller):
//
//	claim:   create IPBlock{node, Active}   (AlreadyExists: someone holds it)
//	assign:  add the block to NodeConfig.spec.blocks
//	release: set releasing in NodeConfig (daemon stops allocating), wait for
//	         status at that generation to show used == 0, set the IPBlock
//	         Released, remove the block from the spec, delete the IPBlock.
//
// Reconciling a node restores the invariant from whatever state it finds:
// an Active claim missing from the spec is added, a Released claim is
// removed from the spec and then deleted. A block thus leaves a node's spec
// only after its claim is Released, and a Released claim is never
// reactivated (the CRD forbids it), so no block is ever in two specs.

func errOverlap(pool string, p netip.Prefix, other string, q netip.Prefix) error {
	return fmt.Errorf("spec.cidrs: %s overlaps %s of the older IPPool %s; the pool is ignored", p, q, other)
}

func (c *Controller) nodeConfig(name string) *coordinov1alpha1.NodeConfig {
	o, ok, _ := c.NodeConfigs.GetByKey(name)
	if !ok {
		return nil
	}
	return o.(*coordinov1alpha1.NodeConfig)
}

// syncNode brings one node's NodeConfig and claims in line.
func (c *Controller) syncNode(ctx context.Context, name string) error {
	o, exists, _ := c.Nodes.GetByKey(name)
	nc := c.nodeConfig(name)
	if !exists {
		if err := c.deleteNodeEndpoints(ctx, name); err != nil {
			return err
		}
		return c.reclaimNode(ctx, name, nc)
	}
	node := o.(*corev1.Node)
	if nc == nil {
		created, err := c.crd.CoordinoV1alpha1().NodeConfigs().Create(ctx, &coordinov1alpha1.NodeConfig{
			ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
		c.writes.add("nodeconfigs", "create")
		if apierrors.IsAlreadyExists(err) {
			created, err = c.crd.CoordinoV1alpha1().NodeConfigs().Get(ctx, name, metav1.GetOptions{})
		}
		if err != nil {
			return fmt.Errorf("create NodeConfig %s: %w", name, err)
		}
		_ = c.NodeConfigs.Update(created)
		nc = created
	}
	if c.opts.IPAM == IPAMKubernetes {
		return c.syncPodCIDRs(ctx, node, nc)
	}
	return c.syncPoolBlocks(ctx, node, nc)
}

// syncPodCIDRs mirrors Node.spec.podCIDRs into the NodeConfig, so the
// daemon has one input in both IPAM modes.
func (c *Controller) syncPodCIDRs(ctx context.Context, node *corev1.Node, nc *coordinov1alpha1.NodeConfig) error {
	var want []coordinov1alpha1.NodeBlock
	for i, s := range node.Spec.PodCIDRs {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return fmt.Errorf("node %s spec.podCIDRs[%d]: %w", node.Name, i, err)
		}
		want = append(want, coordinov1alpha1.NodeBlock{CIDR: p.Masked().String(), Pool: coordinov1alpha1.PodCIDRsPool})
	}
	if equality.Semantic.DeepEqual(want, nc.Spec.Blocks) || len(want) == 0 && len(nc.Spec.Blocks) == 0 {
		return nil
	}
	return c.writeBlocks(ctx, nc, want)
}

func (c *Controller) writeBlocks(ctx context.Context, nc *coordinov1alpha1.NodeConfig, blocks []coordinov1alpha1.NodeBlock) error {
	upd := nc.DeepCopy()
	upd.Spec.Blocks = blocks
	out, err := c.crd.CoordinoV1alpha1().NodeConfigs().Update(ctx, upd, metav1.UpdateOptions{})
	c.writes.add("nodeconfigs", "update")
	if err != nil {
		return fmt.Errorf("update NodeConfig %s: %w", nc.Name, err)
	}
	_ = c.NodeConfigs.Update(out)
	return nil
}

// nodeBlock is a spec entry with its parsed prefix and reported usage.
type nodeBlock struct {
	coordinov1alpha1.NodeBlock
	prefix   netip.Prefix
	used     int32
	capacity int32
	reported bool
}

func (b *nodeBlock) free() int {
	if b.Releasing {
		return 0
	}
	return int(b.capacity - b.used)
}

// blockSync is one pass of syncPoolBlocks over a node: the blocks its spec
// will list, the claims to delete once it no longer does, and whether the
// spec changes.
type blockSync struct {
	node     *corev1.Node
	nc       *coordinov1alpha1.NodeConfig
	held     map[netip.Prefix]blockHolder
	blocks   []*nodeBlock
	inSpec   map[netip.Prefix]bool
	released []netip.Prefix
	changed  bool
	// lacking: some family needed a block and no pool had one.
	lacking bool
}

// syncPoolBlocks brings a node's spec.blocks and its claims in line, in
// the order the block life cycle above allows.
func (c *Controller) syncPoolBlocks(ctx context.Context, node *corev1.Node, nc *coordinov1alpha1.NodeConfig) error {
	bs := &blockSync{node: node, nc: nc, held: c.blocks.ofNode(node.Name), inSpec: map[netip.Prefix]bool{}}
	if err := c.readSpec(ctx, bs); err != nil {
		return err
	}
	bs.adoptClaims()
	if err := c.finishReleases(ctx, bs); err != nil {
		return err
	}
	if err := c.topUp(ctx, bs); err != nil {
		return err
	}
	if !bs.lacking {
		c.doneWaiting(node.Name)
	}
	return c.writeSpec(ctx, bs)
}

// readSpec takes the spec's blocks with the usage the daemon reports,
// claiming any the index has no claim for; it drops blocks that are not
// the pools' and those whose release only has to be finished.
func (c *Controller) readSpec(ctx context.Context, bs *blockSync) error {
	node := bs.node
	usage := map[string]coordinov1alpha1.BlockUsage{}
	for _, u := range bs.nc.Status.Blocks {
		usage[u.CIDR] = u
	}
	// Status describes the spec only once the daemon has applied it.
	current := bs.nc.Status.ObservedGeneration >= bs.nc.Generation
	for _, b := range bs.nc.Spec.Blocks {
		p, err := coordinov1alpha1.ParseCIDR("spec.blocks.cidr", b.CIDR)
		if err != nil || b.Pool == coordinov1alpha1.PodCIDRsPool {
			bs.changed = true // not ours to keep: written by hand or by --ipam=kubernetes
			continue
		}
		h, ok := bs.held[p]
		if !ok {
			// No claim in the index: make one (or learn who holds it).
			if err := c.adoptBlock(ctx, node.Name, p, b.Pool); err != nil {
				return err
			}
			h, _ = c.blocks.get(p)
		}
		if h.node != node.Name {
			c.recorder.Eventf(node, corev1.EventTypeWarning, "BlockConflict",
				"NodeConfig lists %s, which IPBlock %s gives to node %s; leaving it for an operator", p, coordinov1alpha1.BlockName(p), h.node)
		}
		if h.phase == coordinov1alpha1.BlockReleased && h.node == node.Name {
			bs.changed = true // finish a release
			continue
		}
		nb := &nodeBlock{NodeBlock: b, prefix: p, capacity: int32(blockCapacity(p))}
		if u, ok := usage[b.CIDR]; ok && current {
			nb.used, nb.reported = u.Used, true
			if u.Capacity > 0 {
				nb.capacity = u.Capacity
			}
		}
		bs.add(nb)
	}
	return nil
}

// adoptClaims adds the node's Active claims the spec lacks (claimed, maybe
// by a controller that died, but not assigned yet); its other claims not in
// the spec are Released and only wait to be deleted.
func (bs *blockSync) adoptClaims() {
	for p, h := range bs.held {
		switch {
		case bs.inSpec[p]:
		case h.phase == coordinov1alpha1.BlockActive:
			bs.add(&nodeBlock{NodeBlock: coordinov1alpha1.NodeBlock{CIDR: p.String(), Pool: h.pool}, prefix: p, capacity: int32(blockCapacity(p))})
			bs.changed = true
		default:
			bs.released = append(bs.released, p)
		}
	}
}

// finishReleases takes out the releasing blocks the daemon reports empty
// at this generation: claim Released first, then out of the spec.
func (c *Controller) finishReleases(ctx context.Context, bs *blockSync) error {
	keep := bs.blocks[:0]
	for _, b := range bs.blocks {
		if b.Releasing && b.reported && b.used == 0 {
			if err := c.releaseClaim(ctx, b.prefix); err != nil {
				return err
			}
			bs.released = append(bs.released, b.prefix)
			bs.changed = true
			continue
		}
		keep = append(keep, b)
	}
	bs.blocks = keep
	return nil
}

// topUp claims a block for each family the node's pools serve that has
// fewer free addresses than the minimum, and marks one block releasing in a
// family with a surplus.
func (c *Controller) topUp(ctx context.Context, bs *blockSync) error {
	for _, fam := range families {
		pools := c.poolsFor(bs.node, fam)
		if len(pools) == 0 {
			continue
		}
		free := 0
		for _, b := range bs.blocks {
			if family(b.prefix) == fam {
				free += b.free()
			}
		}
		if free < c.opts.MinFreeAddresses {
			p, pool, err := c.claimBlock(ctx, bs.node, pools, fam)
			if err != nil {
				return err
			}
			bs.lacking = bs.lacking || !p.IsValid()
			if p.IsValid() {
				bs.blocks = append(bs.blocks, &nodeBlock{NodeBlock: coordinov1alpha1.NodeBlock{CIDR: p.String(), Pool: pool}, prefix: p, capacity: int32(blockCapacity(p))})
				bs.changed = true
			}
			continue
		}
		if b := c.surplusBlock(bs.node.Name, bs.blocks, fam, free); b != nil {
			b.Releasing = true
			bs.changed = true
		}
	}
	return nil
}

// writeSpec writes the spec if it changed, sorted by address, then deletes
// the Released claims it no longer lists.
func (c *Controller) writeSpec(ctx context.Context, bs *blockSync) error {
	if bs.changed {
		blocks := bs.blocks
		sort.Slice(blocks, func(i, j int) bool { return blocks[i].prefix.Addr().Less(blocks[j].prefix.Addr()) })
		spec := make([]coordinov1alpha1.NodeBlock, 0, len(blocks))
		for _, b := range blocks {
			spec = append(spec, b.NodeBlock)
		}
		if err := c.writeBlocks(ctx, bs.nc, spec); err != nil {
			return err
		}
	}
	for _, p := range bs.released {
		if err := c.deleteClaim(ctx, p); err != nil {
			return err
		}
	}
	return nil
}

// add keeps b in the spec.
func (bs *blockSync) add(b *nodeBlock) {
	bs.blocks = append(bs.blocks, b)
	bs.inSpec[b.prefix] = true
}

// surplusBlock picks an empty block the node can give back while keeping
// twice the minimum free (hysteresis against add/release flapping), once it
// has been empty for ReleaseEmptyAfter.
func (c *Controller) surplusBlock(node string, blocks []*nodeBlock, fam Family, free int) *nodeBlock {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	var pick *nodeBlock
	for i := len(blocks) - 1; i >= 0; i-- {
		b := blocks[i]
		if family(b.prefix) != fam || b.Releasing {
			continue
		}
		if !b.reported || b.used != 0 {
			delete(c.emptySince, b.prefix)
			continue
		}
		since, ok := c.emptySince[b.prefix]
		if !ok {
			c.emptySince[b.prefix] = now
			c.nodeQueue.AddAfter(node, c.opts.ReleaseEmptyAfter)
			continue
		}
		if pick == nil && now.Sub(since) >= c.opts.ReleaseEmptyAfter && free-int(b.capacity) >= 2*c.opts.MinFreeAddresses {
			pick = b
		}
	}
	if pick != nil {
		delete(c.emptySince, pick.prefix)
	}
	return pick
}

// blockCapacity is the address count of a block, capped for int32 fields.
func blockCapacity(p netip.Prefix) int {
	host := p.Addr().BitLen() - p.Bits()
	if host >= 31 {
		return math.MaxInt32
	}
	return 1 << host
}

// poolsFor returns the enabled pools that select node and have ranges of
// the family, by name.
func (c *Controller) poolsFor(node *corev1.Node, fam Family) []*coordinov1alpha1.IPPool {
	var out []*coordinov1alpha1.IPPool
	for _, o := range c.IPPools.List() {
		p := o.(*coordinov1alpha1.IPPool)
		if p.Spec.Disabled || c.blocks.totalIn(p.Name)[fam] == 0 {
			continue
		}
		if len(p.Spec.NodeSelector) > 0 && !labels.SelectorFromSet(p.Spec.NodeSelector).Matches(labels.Set(node.Labels)) {
			continue
		}
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b *coordinov1alpha1.IPPool) int {
		if a.Name < b.Name {
			return -1
		}
		return 1
	})
	return out
}

// claimBlock creates the IPBlock of a free block of the family for node.
// AlreadyExists means another controller (or an index lagging behind the
// API) holds it: record the real holder and try the next one. An empty
// prefix with no error means every pool is exhausted (Event + condition).
func (c *Controller) claimBlock(ctx context.Context, node *corev1.Node, pools []*coordinov1alpha1.IPPool, fam Family) (netip.Prefix, string, error) {
	for _, pool := range pools {
		for {
			p, ok := c.blocks.reserve(pool.Name, fam, node.Name)
			if !ok {
				break
			}
			claim := &coordinov1alpha1.IPBlock{ObjectMeta: metav1.ObjectMeta{Name: coordinov1alpha1.BlockName(p)},
				Spec: coordinov1alpha1.IPBlockSpec{CIDR: p.String(), Pool: pool.Name, Node: node.Name, Phase: coordinov1alpha1.BlockActive}}
			out, err := c.crd.CoordinoV1alpha1().IPBlocks().Create(ctx, claim, metav1.CreateOptions{})
			c.writes.add("ipblocks", "create")
			if err == nil {
				c.blocks.set(p, blockHolder{node: node.Name, pool: pool.Name, phase: coordinov1alpha1.BlockActive, uid: out.UID})
				_ = c.IPBlocks.Update(out)
				blocksAllocated.Inc()
				c.log.Debug("block claimed", zap.String("node", node.Name), zap.Stringer("block", p), zap.String("pool", pool.Name))
				return p, pool.Name, nil
			}
			if !apierrors.IsAlreadyExists(err) {
				c.blocks.unreserve(p, node.Name)
				return netip.Prefix{}, "", fmt.Errorf("claim %s for %s: %w", p, node.Name, err)
			}
			if err := c.learnClaim(ctx, p); err != nil {
				return netip.Prefix{}, "", err
			}
			if h, _ := c.blocks.get(p); h.node == node.Name && h.phase == coordinov1alpha1.BlockActive {
				return p, pool.Name, nil // an overlapping controller claimed it for this very node
			}
		}
	}
	for _, pool := range pools {
		c.recorder.Eventf(pool, corev1.EventTypeWarning, "PoolExhausted", "no free block left for node %s (%s)", node.Name, fam)
		c.setWaiting(pool.Name, node.Name)
	}
	c.recorder.Eventf(node, corev1.EventTypeWarning, "PoolExhausted", "no IPPool has a free %s block for this node", fam)
	poolExhaustion.Inc()
	return netip.Prefix{}, "", nil
}

// learnClaim reads the IPBlock of p from the API into the index.
func (c *Controller) learnClaim(ctx context.Context, p netip.Prefix) error {
	b, err := c.crd.CoordinoV1alpha1().IPBlocks().Get(ctx, coordinov1alpha1.BlockName(p), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		c.blocks.remove(p, "") // deleted meanwhile: free again
		return nil
	}
	if err != nil {
		return fmt.Errorf("read IPBlock of %s: %w", p, err)
	}
	c.blocks.set(p, blockHolder{node: b.Spec.Node, pool: b.Spec.Pool, phase: b.Spec.Phase, uid: b.UID})
	return nil
}

// adoptBlock claims a block found in a spec without a claim in the index.
func (c *Controller) adoptBlock(ctx context.Context, node string, p netip.Prefix, pool string) error {
	claim := &coordinov1alpha1.IPBlock{ObjectMeta: metav1.ObjectMeta{Name: coordinov1alpha1.BlockName(p)},
		Spec: coordinov1alpha1.IPBlockSpec{CIDR: p.String(), Pool: pool, Node: node, Phase: coordinov1alpha1.BlockActive}}
	out, err := c.crd.CoordinoV1alpha1().IPBlocks().Create(ctx, claim, metav1.CreateOptions{})
	c.writes.add("ipblocks", "create")
	if err == nil {
		c.blocks.set(p, blockHolder{node: node, pool: pool, phase: coordinov1alpha1.BlockActive, uid: out.UID})
		return nil
	}
	if !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("claim %s for %s: %w", p, node, err)
	}
	return c.learnClaim(ctx, p)
}

// releaseClaim moves p's IPBlock to Released (resourceVersion-checked).
func (c *Controller) releaseClaim(ctx context.Context, p netip.Prefix) error {
	cl := c.crd.CoordinoV1alpha1().IPBlocks()
	b, err := cl.Get(ctx, coordinov1alpha1.BlockName(p), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if b.Spec.Phase == coordinov1alpha1.BlockReleased {
		return nil
	}
	b.Spec.Phase = coordinov1alpha1.BlockReleased
	out, err := cl.Update(ctx, b, metav1.UpdateOptions{})
	c.writes.add("ipblocks", "update")
	if err != nil {
		return fmt.Errorf("release IPBlock %s: %w", b.Name, err)
	}
	c.blocks.set(p, blockHolder{node: out.Spec.Node, pool: out.Spec.Pool, phase: out.Spec.Phase, uid: out.UID})
	return nil
}

// deleteClaim deletes a Released IPBlock; the UID precondition keeps a
// stale view from deleting a newer claim on the same block.
func (c *Controller) deleteClaim(ctx context.Context, p netip.Prefix) error {
	h, ok := c.blocks.get(p)
	if !ok || h.phase != coordinov1alpha1.BlockReleased {
		return nil
	}
	opts := metav1.DeleteOptions{}
	if h.uid != "" {
		uid := h.uid
		opts.Preconditions = &metav1.Preconditions{UID: &uid}
	}
	err := c.crd.CoordinoV1alpha1().IPBlocks().Delete(ctx, coordinov1alpha1.BlockName(p), opts)
	c.writes.add("ipblocks", "delete")
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("delete IPBlock of %s: %w", p, err)
	}
	c.blocks.remove(p, h.uid)
	c.blockFreed(h.pool)
	blocksReleased.Inc()
	return nil
}

// reclaimNode frees the blocks of a deleted Node once no endpoint uses
// them: the daemon reported every block empty, or no pod of the node is
// left (its daemon is gone with it). Pod deletions requeue the node.
func (c *Controller) reclaimNode(ctx context.Context, name string, nc *coordinov1alpha1.NodeConfig) error {
	held := c.blocks.ofNode(name)
	if nc == nil && len(held) == 0 {
		return nil
	}
	if pods := c.idents.podsOn(name); pods > 0 && !(nc != nil && allReportedEmpty(nc)) {
		c.log.Info("deleted node still has pods; keeping its blocks", zap.String("node", name), zap.Int("pods", pods))
		return nil
	}
	// The cache says deleted; the API server decides. A replica whose Node
	// informer lags or missed an event must not hand a live node's
	// addresses to another node.
	if live, err := c.nodeExists(ctx, name); err != nil || live {
		if live {
			c.log.Warn("node missing from the cache is live in the API server; keeping its blocks", zap.String("node", name))
		}
		return err
	}
	for p, h := range held {
		if h.phase == coordinov1alpha1.BlockActive {
			if err := c.releaseClaim(ctx, p); err != nil {
				return err
			}
		}
	}
	if nc != nil {
		uid := nc.UID
		err := c.crd.CoordinoV1alpha1().NodeConfigs().Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
		c.writes.add("nodeconfigs", "delete")
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete NodeConfig %s: %w", name, err)
		}
		_ = c.NodeConfigs.Delete(nc)
	}
	for p := range held {
		if err := c.deleteClaim(ctx, p); err != nil {
			return err
		}
	}
	c.doneWaiting(name)
	c.log.Info("reclaimed the blocks of a deleted node", zap.String("node", name), zap.Int("blocks", len(held)))
	return nil
}

// nodeExists asks the API server (not the cache) whether Node name exists.
func (c *Controller) nodeExists(ctx context.Context, name string) (bool, error) {
	_, err := c.core.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	switch {
	case err == nil:
		return true, nil
	case apierrors.IsNotFound(err):
		return false, nil
	}
	return false, fmt.Errorf("confirm Node %s is gone before reclaiming its blocks: %w", name, err)
}

// allReportedEmpty: status at the current generation shows every block
// with used == 0.
func allReportedEmpty(nc *coordinov1alpha1.NodeConfig) bool {
	if nc.Status.ObservedGeneration < nc.Generation {
		return false
	}
	used := map[string]int32{}
	for _, u := range nc.Status.Blocks {
		used[u.CIDR] = u.Used
	}
	for _, b := range nc.Spec.Blocks {
		if u, ok := used[b.CIDR]; !ok || u != 0 {
			return false
		}
	}
	return true
}

// syncPoolStatus writes a pool's block counts and Exhausted condition.
func (c *Controller) syncPoolStatus(ctx context.Context, name string) error {
	o, ok, _ := c.IPPools.GetByKey(name)
	if !ok {
		return nil
	}
	pool := o.(*coordinov1alpha1.IPPool)
	st := pool.Status.DeepCopy()
	alloc, total := c.blocks.allocatedIn(name), c.blocks.totalIn(name)
	st.Families = nil
	var sumA, sumT uint64
	for _, fam := range families {
		if total[fam] == 0 {
			continue
		}
		st.Families = append(st.Families, coordinov1alpha1.PoolFamilyStatus{Family: fam.String(),
			BlockSize:   int32(pool.Spec.BlockSize(fam == IPv6)),
			TotalBlocks: sat32(total[fam]), AllocatedBlocks: sat32(uint64(alloc[fam]))})
		sumA += uint64(alloc[fam])
		sumT = satAdd(sumT, total[fam])
	}
	st.TotalBlocks, st.AllocatedBlocks = sat32(sumT), sat32(sumA)
	cond := metav1.Condition{Type: coordinov1alpha1.ConditionExhausted, Status: metav1.ConditionFalse, Reason: "BlocksAvailable",
		Message: "every node that asked got a block", ObservedGeneration: pool.Generation}
	if c.isExhausted(name) {
		cond.Status, cond.Reason, cond.Message = metav1.ConditionTrue, "NoFreeBlock", "a node needs a block and none is free; add CIDRs or another IPPool"
	}
	meta.SetStatusCondition(&st.Conditions, cond)
	if equality.Semantic.DeepEqual(st, &pool.Status) {
		return nil
	}
	upd := pool.DeepCopy()
	upd.Status = *st
	out, err := c.crd.CoordinoV1alpha1().IPPools().UpdateStatus(ctx, upd, metav1.UpdateOptions{})
	c.writes.add("ippools", "update-status")
	if err != nil {
		return fmt.Errorf("update IPPool %s status: %w", name, err)
	}
	_ = c.IPPools.Update(out)
	return nil
}

func sat32(v uint64) int32 {
	if v > math.MaxInt32 {
		return math.MaxInt32
	}
	return int32(v)
}

func satAdd(a, b uint64) uint64 {
	if a > math.MaxUint64-b {
		return math.MaxUint64
	}
	return a + b
}
