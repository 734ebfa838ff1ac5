package daemon

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubefake "k8s.io/client-go/kubernetes/fake"

	coordinofake "github.com/coordino/coordino/api/client/clientset/versioned/fake"
	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
	"github.com/coordino/coordino/daemon/config"
)

// The node's BGPPeerPolicy configures the speaker, with the MD5 password
// from its Secret; a change of peers reconfigures it; a policy whose Secret
// lacks the key is refused naming it and changes nothing. Peers are
// loopback ports nobody listens on.
func TestBGPFollowsTheNodesPolicy(t *testing.T) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{"rack": "a"}}}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "bgp", Namespace: "coordino-system"}, Data: map[string][]byte{"password": []byte("s3cret")}}
	kube := kubefake.NewClientset(node, secret)
	peer := func(addr string) coordinov1alpha1.BGPPeer {
		return coordinov1alpha1.BGPPeer{Address: addr, ASN: 65000, Port: 1, PasswordSecretRef: &coordinov1alpha1.SecretKeyRef{Name: "bgp", Key: "password"}}
	}
	pol := &coordinov1alpha1.BGPPeerPolicy{ObjectMeta: metav1.ObjectMeta{Name: "rack-a"}, Spec: coordinov1alpha1.BGPPeerPolicySpec{
		NodeSelector: map[string]string{"rack": "a"}, LocalASN: 64512, ListenPort: -1, Peers: []coordinov1alpha1.BGPPeer{peer("127.0.0.2")}}}
	other := &coordinov1alpha1.BGPPeerPolicy{ObjectMeta: metav1.ObjectMeta{Name: "rack-b"}, Spec: coordinov1alpha1.BGPPeerPolicySpec{
		NodeSelector: map[string]string{"rack": "b"}, LocalASN: 64999, ListenPort: -1, Peers: []coordinov1alpha1.BGPPeer{peer("127.0.0.9")}}}
	cl := coordinofake.NewSimpleClientset(pol, other)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b := &bgpNode{o: &config.Options{NodeName: "n1", StateDir: t.TempDir()}, log: zap.NewNop(), addrs: []netip.Addr{netip.MustParseAddr("127.0.0.1")}}
	sessions := func() []string {
		t.Helper()
		ns, err := b.speaker().Neighbors(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, n := range ns {
			out = append(out, n.Address.String())
		}
		return out
	}
	if err := b.syncPolicy(ctx, cl, kube, "coordino-system"); err != nil {
		t.Fatal(err)
	}
	if b.speaker() == nil {
		t.Fatal("no speaker after a policy selected the node")
	}
	t.Cleanup(b.speaker().Stop)
	if got := sessions(); !slices.Equal(got, []string{"127.0.0.2"}) {
		t.Fatalf("sessions %v, want rack-a's peer", got)
	}
	pol.Spec.Peers = append(pol.Spec.Peers, peer("127.0.0.3"))
	if _, err := cl.CoordinoV1alpha1().BGPPeerPolicies().Update(ctx, pol, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := b.syncPolicy(ctx, cl, kube, "coordino-system"); err != nil {
		t.Fatal(err)
	}
	if got := sessions(); !slices.Equal(got, []string{"127.0.0.2", "127.0.0.3"}) {
		t.Fatalf("after the update: %v", got)
	}
	pol.Spec.Peers = []coordinov1alpha1.BGPPeer{peer("127.0.0.4")}
	pol.Spec.Peers[0].PasswordSecretRef.Key = "nope"
	if _, err := cl.CoordinoV1alpha1().BGPPeerPolicies().Update(ctx, pol, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	err := b.syncPolicy(ctx, cl, kube, "coordino-system")
	if err == nil || !strings.Contains(err.Error(), `no key "nope"`) || strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("missing key: %v, want an error naming it (and never the password)", err)
	}
	if got := sessions(); !slices.Equal(got, []string{"127.0.0.2", "127.0.0.3"}) {
		t.Errorf("a refused policy changed the sessions: %v", got)
	}
}
