package cluster

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/coordino/coordino/test/testbed"
)

// Control plane ports, inside the control plane's own namespace.
const (
	etcdClientPort = 2379
	etcdPeerPort   = 2380
	apiServerPort  = 6443
)

// Server is the API server URL, on the control plane's underlay address.
func Server() string { return fmt.Sprintf("https://%s:%d", controlPlaneIP, apiServerPort) }

// startControlPlane issues the certificates and starts etcd,
// kube-apiserver, kube-controller-manager and kube-scheduler in the control
// plane namespace.
func (c *Cluster) startControlPlane(ctx context.Context) error {
	if err := c.startHolder(c.cp, machineSpec{Hostname: c.cp.name}); err != nil {
		return err
	}
	pki, err := testbed.NewPKI(c.path("pki"), c.cp.name)
	if err != nil {
		return err
	}
	c.pki = pki
	// The API server is reached on the underlay (nodes, host) and through
	// the kubernetes Service (pods).
	err = pki.Issue("apiserver", "kube-apiserver", nil,
		[]string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc." + ClusterDNS},
		ips(netip.MustParseAddr("127.0.0.1"), controlPlaneIP, kubernetesServiceIP()), true)
	if err != nil {
		return err
	}
	for _, id := range []struct{ name, cn string }{
		{"kube-controller-manager", "system:kube-controller-manager"},
		{"kube-scheduler", "system:kube-scheduler"},
		{"kube-proxy", "system:kube-proxy"},
	} {
		if err := pki.Issue(id.name, id.cn, nil, nil, nil, false); err != nil {
			return err
		}
	}
	server := Server()
	if c.Kubeconfig, err = pki.Kubeconfig("admin", server); err != nil {
		return err
	}
	if _, err := c.startIn(c.cp, "etcd", c.bins.etcd, testbed.EtcdArgs(c.path("etcd"), etcdClientPort, etcdPeerPort)); err != nil {
		return err
	}
	// The single-node bed's flags, except what ties its API server to
	// loopback and to a node named localhost.
	var apiArgs []string
	for _, a := range testbed.APIServerArgs(pki, etcdClientPort, apiServerPort, c.path("apiserver-certs")) {
		name, _, _ := strings.Cut(a, "=")
		switch name {
		case "--bind-address", "--advertise-address", "--endpoint-reconciler-type", "--kubelet-preferred-address-types", "--service-cluster-ip-range":
			continue
		}
		apiArgs = append(apiArgs, a)
	}
	apiArgs = append(apiArgs, "--bind-address=0.0.0.0", "--advertise-address="+controlPlaneIP.String(),
		"--endpoint-reconciler-type=lease", "--kubelet-preferred-address-types=InternalIP",
		"--service-cluster-ip-range="+ServiceCIDR)
	apiServer, err := c.startIn(c.cp, "kube-apiserver", c.bins.apiServer, apiArgs)
	if err != nil {
		return err
	}
	if err := c.newClient(); err != nil {
		return err
	}
	err = testbed.WaitFor(ctx, "kube-apiserver /readyz", 120*time.Second, func() error {
		if !apiServer.Running() {
			return fmt.Errorf("kube-apiserver exited, see %s", apiServer.LogPath)
		}
		_, err := c.Client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err
	})
	if err != nil {
		return err
	}
	kcmCfg, err := pki.Kubeconfig("kube-controller-manager", server)
	if err != nil {
		return err
	}
	if _, err := c.startIn(c.cp, "kube-controller-manager", c.bins.controllerManager, []string{
		"--kubeconfig=" + kcmCfg, "--authentication-kubeconfig=" + kcmCfg, "--authorization-kubeconfig=" + kcmCfg,
		"--bind-address=127.0.0.1", "--leader-elect=false", "--use-service-account-credentials=true",
		"--service-account-private-key-file=" + pki.Key("sa"), "--root-ca-file=" + pki.Cert("ca"),
		// Pod ranges are Coordino's (IPPools), not the Node objects'.
		"--service-cluster-ip-range=" + ServiceCIDR, "--allocate-node-cidrs=false",
		// Fast eviction would blur failures: a NotReady node keeps its pods.
		"--node-monitor-grace-period=60s",
		"--profiling=false", "--v=1",
	}); err != nil {
		return err
	}
	schedCfg, err := pki.Kubeconfig("kube-scheduler", server)
	if err != nil {
		return err
	}
	if _, err := c.startIn(c.cp, "kube-scheduler", c.bins.scheduler, []string{
		"--kubeconfig=" + schedCfg, "--authentication-kubeconfig=" + schedCfg, "--authorization-kubeconfig=" + schedCfg,
		"--bind-address=127.0.0.1", "--leader-elect=false", "--profiling=false", "--v=1",
	}); err != nil {
		return err
	}
	// The controller manager's service account controller creates the
	// default ServiceAccount of every namespace; pods wait for it.
	return testbed.WaitFor(ctx, "default ServiceAccount", 90*time.Second, func() error {
		_, err := c.Client.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		return err
	})
}
