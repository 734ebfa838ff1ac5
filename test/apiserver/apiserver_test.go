package apiserver

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/coordino/coordino/api/client/clientset/versioned"
	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
)

// TestCRDValidation starts the real API server and checks that the CRD
// schemas reject what they promise to, accept the examples, default block
// sizes, and serve status as a subresource.
func TestCRDValidation(t *testing.T) {
	s := Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cs := versioned.NewForConfigOrDie(s.Config).CoordinoV1alpha1()

	pool := func(name string, spec coordinov1alpha1.IPPoolSpec) error {
		_, err := cs.IPPools().Create(ctx, &coordinov1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec}, metav1.CreateOptions{})
		return err
	}
	if err := pool("dual", coordinov1alpha1.IPPoolSpec{CIDRs: []string{"10.244.0.0/16", "fd00:10:244::/56"}}); err != nil {
		t.Fatalf("valid dual-stack pool rejected: %v", err)
	}
	got, err := cs.IPPools().Get(ctx, "dual", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Spec.BlockSizeIPv4 != 26 || got.Spec.BlockSizeIPv6 != 122 {
		t.Errorf("block sizes not defaulted: %+v", got.Spec)
	}
	for name, tc := range map[string]struct {
		spec coordinov1alpha1.IPPoolSpec
		want string
	}{
		"host-bits":   {coordinov1alpha1.IPPoolSpec{CIDRs: []string{"10.244.0.1/16"}}, "host bits zero"},
		"not-cidr":    {coordinov1alpha1.IPPoolSpec{CIDRs: []string{"10.244.0.0"}}, "host bits zero"},
		"block-range": {coordinov1alpha1.IPPoolSpec{CIDRs: []string{"10.0.0.0/8"}, BlockSizeIPv4: 31}, "blockSizeIPv4"},
		"v6-range":    {coordinov1alpha1.IPPoolSpec{CIDRs: []string{"fd00::/48"}, BlockSizeIPv6: 127}, "blockSizeIPv6"},
		"too-small":   {coordinov1alpha1.IPPoolSpec{CIDRs: []string{"10.0.0.0/28"}}, "at least as large as blockSizeIPv4"},
		"no-cidrs":    {coordinov1alpha1.IPPoolSpec{}, "cidrs"},
	} {
		err := pool(name, tc.spec)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one mentioning %q", name, err, tc.want)
		}
	}
	got.Spec.BlockSizeIPv4 = 24
	if _, err := cs.IPPools().Update(ctx, got, metav1.UpdateOptions{}); err == nil || !strings.Contains(err.Error(), "immutable") {
		t.Errorf("block size change: error %v, want immutable", err)
	}

	// Status is a subresource: a spec update does not change it, and
	// UpdateStatus does not change spec.
	nc, err := cs.NodeConfigs().Create(ctx, &coordinov1alpha1.NodeConfig{ObjectMeta: metav1.ObjectMeta{Name: "node-a"},
		Spec:   coordinov1alpha1.NodeConfigSpec{Blocks: []coordinov1alpha1.NodeBlock{{CIDR: "10.244.0.0/26", Pool: "dual"}}},
		Status: coordinov1alpha1.NodeConfigStatus{Addresses: []string{"192.0.2.1"}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(nc.Status.Addresses) != 0 {
		t.Errorf("create wrote status: %+v", nc.Status)
	}
	nc.Status.Addresses = []string{"192.0.2.1"}
	nc.Status.Blocks = []coordinov1alpha1.BlockUsage{{CIDR: "10.244.0.0/26", Used: 3, Capacity: 64}}
	nc.Spec.Blocks = nil
	nc, err = cs.NodeConfigs().UpdateStatus(ctx, nc, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(nc.Spec.Blocks) != 1 || len(nc.Status.Addresses) != 1 {
		t.Errorf("UpdateStatus: spec %+v status %+v", nc.Spec, nc.Status)
	}
	nc.Status.Addresses = []string{"not-an-ip"}
	if _, err := cs.NodeConfigs().UpdateStatus(ctx, nc, metav1.UpdateOptions{}); err == nil {
		t.Error("status address not-an-ip accepted")
	}
	bad := &coordinov1alpha1.NodeConfig{ObjectMeta: metav1.ObjectMeta{Name: "node-b"},
		Spec: coordinov1alpha1.NodeConfigSpec{Blocks: []coordinov1alpha1.NodeBlock{{CIDR: "10.244.0.1/26", Pool: "dual"}}}}
	if _, err := cs.NodeConfigs().Create(ctx, bad, metav1.CreateOptions{}); err == nil {
		t.Error("block with host bits accepted")
	}

	// Identity names are the number, within the cluster range; spec immutable.
	ident := func(name string) error {
		_, err := cs.Identities().Create(ctx, &coordinov1alpha1.Identity{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: coordinov1alpha1.IdentitySpec{Namespace: "default", Labels: map[string]string{"app": "x"}}}, metav1.CreateOptions{})
		return err
	}
	if err := ident("4711"); err != nil {
		t.Fatalf("identity 4711: %v", err)
	}
	for _, n := range []string{"255", "8388608", "web", "0256"} {
		if err := ident(n); err == nil {
			t.Errorf("identity name %q accepted", n)
		}
	}
	id, err := cs.Identities().Get(ctx, "4711", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	id.Spec.Labels["app"] = "y"
	if _, err := cs.Identities().Update(ctx, id, metav1.UpdateOptions{}); err == nil {
		t.Error("identity spec change accepted")
	}

	// IPBlock phase only moves forward.
	blk, err := cs.IPBlocks().Create(ctx, &coordinov1alpha1.IPBlock{ObjectMeta: metav1.ObjectMeta{Name: "10.244.0.0-26"},
		Spec: coordinov1alpha1.IPBlockSpec{CIDR: "10.244.0.0/26", Pool: "dual", Node: "node-a", Phase: coordinov1alpha1.BlockReleased}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	blk.Spec.Phase = coordinov1alpha1.BlockActive
	if _, err := cs.IPBlocks().Update(ctx, blk, metav1.UpdateOptions{}); err == nil {
		t.Error("IPBlock Released -> Active accepted")
	}

	// BGPPeerPolicy: the API server holds the daemon's ranges.
	bgpPolicy := func(name string, mutate func(*coordinov1alpha1.BGPPeerPolicySpec)) error {
		spec := coordinov1alpha1.BGPPeerPolicySpec{LocalASN: 64512, Peers: []coordinov1alpha1.BGPPeer{{Address: "192.0.2.254", ASN: 65000, Families: []string{"IPv4", "IPv6"}}}}
		mutate(&spec)
		_, err := cs.BGPPeerPolicies().Create(ctx, &coordinov1alpha1.BGPPeerPolicy{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec}, metav1.CreateOptions{})
		return err
	}
	if err := bgpPolicy("ok", func(*coordinov1alpha1.BGPPeerPolicySpec) {}); err != nil {
		t.Errorf("valid BGPPeerPolicy rejected: %v", err)
	}
	// The serviceSelector survives the schema (pruned, it would announce
	// nothing).
	sel := &metav1.LabelSelector{MatchLabels: map[string]string{"bgp": "announce"}}
	if err := bgpPolicy("services", func(s *coordinov1alpha1.BGPPeerPolicySpec) { s.ServiceSelector = sel }); err != nil {
		t.Errorf("BGPPeerPolicy with a serviceSelector rejected: %v", err)
	} else if got, err := cs.BGPPeerPolicies().Get(ctx, "services", metav1.GetOptions{}); err != nil || got.Spec.ServiceSelector == nil || got.Spec.ServiceSelector.MatchLabels["bgp"] != "announce" {
		t.Errorf("BGPPeerPolicy's serviceSelector read back as %+v (%v)", got, err)
	}
	for name, mutate := range map[string]func(*coordinov1alpha1.BGPPeerPolicySpec){
		"asn-zero":   func(s *coordinov1alpha1.BGPPeerPolicySpec) { s.LocalASN = 0 },
		"no-peers":   func(s *coordinov1alpha1.BGPPeerPolicySpec) { s.Peers = nil },
		"family":     func(s *coordinov1alpha1.BGPPeerPolicySpec) { s.Peers[0].Families = []string{"IPX"} },
		"hold":       func(s *coordinov1alpha1.BGPPeerPolicySpec) { s.Peers[0].HoldTimeSeconds = 2 },
		"restart":    func(s *coordinov1alpha1.BGPPeerPolicySpec) { s.RestartTimeSeconds = 5000 },
		"listenport": func(s *coordinov1alpha1.BGPPeerPolicySpec) { s.ListenPort = -2 },
	} {
		if err := bgpPolicy(name, mutate); err == nil {
			t.Errorf("BGPPeerPolicy %s accepted", name)
		}
	}
}

// TestServiceAccountConfig checks that the returned configuration really
// authenticates as the service account (RBAC denies it by default).
func TestServiceAccountConfig(t *testing.T) {
	s := Start(t)
	ctx := context.Background()
	cfg, err := s.ServiceAccountConfig(ctx, "coordino-system", "probe")
	if err != nil {
		t.Fatal(err)
	}
	_, err = versioned.NewForConfigOrDie(cfg).CoordinoV1alpha1().IPPools().List(ctx, metav1.ListOptions{})
	if err == nil || !strings.Contains(err.Error(), "system:serviceaccount:coordino-system:probe") {
		t.Fatalf("list as service account: %v, want forbidden naming the account", err)
	}
}

// TestAPIServerRestart: StopAPIServer makes the API unreachable, and
// StartAPIServer brings it back on the same address with etcd's data.
func TestAPIServerRestart(t *testing.T) {
	s := Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cs := versioned.NewForConfigOrDie(s.Config).CoordinoV1alpha1()
	if _, err := cs.IPPools().Create(ctx, &coordinov1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "kept"},
		Spec: coordinov1alpha1.IPPoolSpec{CIDRs: []string{"10.9.0.0/16"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	s.StopAPIServer()
	short, cancelShort := context.WithTimeout(ctx, 3*time.Second)
	_, err := cs.IPPools().Get(short, "kept", metav1.GetOptions{})
	cancelShort()
	if err == nil {
		t.Fatal("API answered while stopped")
	}
	if err := s.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.IPPools().Get(ctx, "kept", metav1.GetOptions{}); err != nil {
		t.Fatalf("after restart: %v", err)
	}
}

// TestIPPoolPrinterColumns asks the real API server for kubectl get's table
// of IPPools: a pool shows the block size of the families its CIDRs have
// and no other, though both spec block sizes are defaulted in every pool.
func TestIPPoolPrinterColumns(t *testing.T) {
	s := Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cs := versioned.NewForConfigOrDie(s.Config).CoordinoV1alpha1()
	// The status the controller writes (syncPoolStatus): one entry per
	// family the pool's CIDRs have, with its block size.
	for name, tc := range map[string]struct {
		cidrs    []string
		families []coordinov1alpha1.PoolFamilyStatus
	}{
		"v4-only": {[]string{"10.250.0.0/16"}, []coordinov1alpha1.PoolFamilyStatus{{Family: "IPv4", BlockSize: 26, TotalBlocks: 1024}}},
		"v6-only": {[]string{"fd00:250::/112"}, []coordinov1alpha1.PoolFamilyStatus{{Family: "IPv6", BlockSize: 122, TotalBlocks: 1024}}},
		"dual": {[]string{"10.251.0.0/16", "fd00:251::/112"}, []coordinov1alpha1.PoolFamilyStatus{
			{Family: "IPv4", BlockSize: 26, TotalBlocks: 1024}, {Family: "IPv6", BlockSize: 122, TotalBlocks: 1024}}},
	} {
		p, err := cs.IPPools().Create(ctx, &coordinov1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: coordinov1alpha1.IPPoolSpec{CIDRs: tc.cidrs}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		p.Status.Families = tc.families
		if _, err := cs.IPPools().UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	raw, err := cs.RESTClient().Get().AbsPath("/apis/coordino.io/v1alpha1/ippools").
		SetHeader("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io").DoRaw(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var table metav1.Table
	if err := json.Unmarshal(raw, &table); err != nil {
		t.Fatalf("table %s: %v", raw, err)
	}
	col := map[string]int{}
	for i, c := range table.ColumnDefinitions {
		col[c.Name] = i
	}
	for _, c := range []string{"Name", "Block4", "Block6"} {
		if _, ok := col[c]; !ok {
			t.Fatalf("no %s column in %+v", c, table.ColumnDefinitions)
		}
	}
	want := map[string][2]any{ // Block4, Block6 as the table carries them (JSON numbers, nil = <none>)
		"v4-only": {float64(26), nil},
		"v6-only": {nil, float64(122)},
		"dual":    {float64(26), float64(122)},
	}
	for _, row := range table.Rows {
		name, _ := row.Cells[col["Name"]].(string)
		w, ok := want[name]
		if !ok {
			continue
		}
		delete(want, name)
		if got := [2]any{row.Cells[col["Block4"]], row.Cells[col["Block6"]]}; got != w {
			t.Errorf("%s: Block4, Block6 = %v, want %v", name, got, w)
		}
	}
	for name := range want {
		t.Errorf("no row for pool %s", name)
	}
}
