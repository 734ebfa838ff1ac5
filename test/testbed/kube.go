package testbed

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// NodeName is the kubelet's node name (and the Coordino daemon's). It is
// "localhost" because kubelet listens on 127.0.0.1 only and refuses a
// loopback node IP: kube-apiserver reaches it (kubectl logs/exec) through the
// Hostname address instead.
const NodeName = "localhost"

// Cluster is the control plane of a bed: etcd and kube-apiserver on
// 127.0.0.1 with ports picked at start, so the bed never collides with
// another cluster on the host.
type Cluster struct {
	PKI      *PKI
	Server   string // https://127.0.0.1:PORT
	Admin    *Kube
	AdminCfg string // admin kubeconfig path (for kubectl users)

	kubeletPort, healthzPort int
}

func freePorts(n int) ([]int, error) {
	// Hold all listeners until every port is picked, so they differ.
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// StartControlPlane generates certificates and starts etcd and
// kube-apiserver, waiting for /readyz.
func (b *Bed) StartControlPlane(ctx context.Context) (*Cluster, error) {
	pki, err := NewPKI(b.path("pki"), NodeName)
	if err != nil {
		return nil, err
	}
	ports, err := freePorts(5)
	if err != nil {
		return nil, err
	}
	etcdClient, etcdPeer, apiPort := ports[0], ports[1], ports[2]
	c := &Cluster{PKI: pki, Server: fmt.Sprintf("https://127.0.0.1:%d", apiPort), kubeletPort: ports[3], healthzPort: ports[4]}

	b.Etcd = &Proc{Name: "etcd", Path: b.Bins.Etcd, Args: EtcdArgs(b.path("etcd"), etcdClient, etcdPeer)}
	if err := b.Start(b.Etcd); err != nil {
		return nil, err
	}
	b.APIServer = &Proc{Name: "kube-apiserver", Path: b.Bins.APIServer, Args: APIServerArgs(pki, etcdClient, apiPort, b.path("apiserver-certs"))}
	if err := b.Start(b.APIServer); err != nil {
		return nil, err
	}
	if c.AdminCfg, err = pki.Kubeconfig("admin", c.Server); err != nil {
		return nil, err
	}
	if c.Admin, err = NewKube(c.Server, pki.Cert("ca"), pki.Cert("admin"), pki.Key("admin")); err != nil {
		return nil, err
	}
	err = WaitFor(ctx, "kube-apiserver /readyz", 90*time.Second, func() error {
		if !b.APIServer.Running() {
			return fmt.Errorf("kube-apiserver exited, see %s", b.APIServer.LogPath)
		}
		return c.Admin.Do(ctx, "GET", "/readyz", nil, nil)
	})
	if err != nil {
		return nil, err
	}
	// No kube-controller-manager: create what it would (the default
	// ServiceAccount Pods need).
	sa := map[string]any{"apiVersion": "v1", "kind": "ServiceAccount",
		"metadata": map[string]any{"name": "default", "namespace": "default"}, "automountServiceAccountToken": false}
	return c, WaitFor(ctx, "default ServiceAccount", 30*time.Second, func() error {
		err := c.Admin.Do(ctx, "POST", "/api/v1/namespaces/default/serviceaccounts", sa, nil)
		if IsConflict(err) {
			return nil
		}
		return err
	})
}

const kubeletConfig = `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: {{PORT}}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: {{HEALTHZ}}
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: {{CA}}}
authorization: {mode: AlwaysAllow}
tlsCertFile: {{CERT}}
tlsPrivateKeyFile: {{KEY}}
# This host has cgroup v1 (hybrid); kubelet refuses v1 unless told otherwise.
failCgroupV1: false
failSwapOn: false
cgroupDriver: cgroupfs
# All pods under one subtree the bed owns (and removes).
cgroupRoot: /{{CGROUP}}
containerRuntimeEndpoint: unix://{{SOCK}}
imageServiceEndpoint: unix://{{SOCK}}
podLogsDir: {{LOGS}}
resolvConf: /etc/resolv.conf
clusterDomain: cluster.local
clusterDNS: [10.96.0.10]
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
registerNode: true
nodeStatusUpdateFrequency: 2s
`

// StartKubelet starts kubelet against the bed's containerd and the cluster
// and waits until the node is Ready.
func (b *Bed) StartKubelet(ctx context.Context, c *Cluster) error {
	if err := EnsureCgroupRoot(cgroupParent); err != nil {
		return err
	}
	kcfg, err := c.PKI.Kubeconfig("kubelet-client", c.Server)
	if err != nil {
		return err
	}
	cfg := strings.NewReplacer(
		"{{PORT}}", strconv.Itoa(c.kubeletPort), "{{HEALTHZ}}", strconv.Itoa(c.healthzPort),
		"{{CA}}", c.PKI.Cert("ca"), "{{CERT}}", c.PKI.Cert("kubelet-serving"), "{{KEY}}", c.PKI.Key("kubelet-serving"),
		"{{CGROUP}}", cgroupParent, "{{SOCK}}", b.ContainerdSock, "{{LOGS}}", b.path("kubelet-pod-logs"),
	).Replace(kubeletConfig)
	cfgPath := b.path("kubelet.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		return err
	}
	b.Kubelet = &Proc{Name: "kubelet", Path: b.Bins.Kubelet, Args: []string{
		"--config=" + cfgPath, "--kubeconfig=" + kcfg, "--root-dir=" + b.path("kubelet"),
		"--hostname-override=" + NodeName, "--v=2",
	}}
	return b.startKubelet(ctx, c)
}

func (b *Bed) startKubelet(ctx context.Context, c *Cluster) error {
	if err := b.Start(b.Kubelet); err != nil {
		return err
	}
	return WaitFor(ctx, "node Ready", 120*time.Second, func() error {
		if !b.Kubelet.Running() {
			return fmt.Errorf("kubelet exited, see %s", b.Kubelet.LogPath)
		}
		return c.Admin.NodeReady(ctx, NodeName)
	})
}

// RestartKubelet stops kubelet (SIGTERM, or SIGKILL when crash) and starts it
// again with the same configuration. It does not wait for Ready when the
// network is expected to be down; use waitReady for that.
func (b *Bed) RestartKubelet(ctx context.Context, c *Cluster, crash bool) error {
	if crash {
		_ = b.Kubelet.Kill()
	} else {
		_ = b.Kubelet.Stop(10 * time.Second)
	}
	b.Kubelet = &Proc{Name: "kubelet", Path: b.Kubelet.Path, Args: b.Kubelet.Args, LogPath: b.Kubelet.LogPath}
	return b.startKubelet(ctx, c)
}

// EnsureCgroupRoot creates the cgroup path root (e.g. "coordino-testbed" or
// "a/b") in every v1 hierarchy (kubelet requires its cgroupRoot to exist) and
// seeds cpuset from the parent, which a fresh v1 cpuset cgroup does not
// inherit.
func EnsureCgroupRoot(root string) error {
	ents, err := os.ReadDir("/sys/fs/cgroup")
	if err != nil {
		return err
	}
	for _, e := range ents {
		h := filepath.Join("/sys/fs/cgroup", e.Name())
		if _, err := os.Stat(filepath.Join(h, "cgroup.procs")); err != nil {
			continue
		}
		parent := h
		for _, elem := range strings.Split(root, "/") {
			d := filepath.Join(parent, elem)
			if err := os.MkdirAll(d, 0o755); err != nil {
				return err
			}
			if e.Name() == "cpuset" {
				for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
					v, err := os.ReadFile(filepath.Join(parent, f))
					if err != nil {
						return err
					}
					if err := os.WriteFile(filepath.Join(d, f), v, 0o644); err != nil {
						return err
					}
				}
			}
			parent = d
		}
	}
	return nil
}

// CreateRuntimeClasses registers one RuntimeClass per containerd handler, so
// Pods choose their network with spec.runtimeClassName.
func (c *Cluster) CreateRuntimeClasses(ctx context.Context) error {
	for _, h := range []string{HandlerBridge, HandlerChained, HandlerPrimary} {
		rc := map[string]any{"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
			"metadata": map[string]any{"name": h}, "handler": h}
		if err := c.Admin.Do(ctx, "POST", "/apis/node.k8s.io/v1/runtimeclasses", rc, nil); err != nil && !IsConflict(err) {
			return err
		}
	}
	return nil
}
