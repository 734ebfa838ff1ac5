package testbed

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
)

// ControlPlaneBinaries returns the cached etcd and kube-apiserver that
// build.sh produced; the error names the build command when one is missing.
// Used by the bed and by test/apiserver, which runs just these two.
func ControlPlaneBinaries(cache string) (etcd, apiServer string, err error) {
	etcd = filepath.Join(cache, "etcd-"+EtcdVersion, "etcd")
	apiServer = filepath.Join(cache, "kube-apiserver-"+K8sVersion, "kube-apiserver")
	for _, p := range []string{etcd, apiServer} {
		if _, err := os.Stat(p); err != nil {
			return etcd, apiServer, fmt.Errorf("%s missing; build it with test/testbed/build.sh etcd kube-apiserver", p)
		}
	}
	return etcd, apiServer, nil
}

// EtcdArgs are the flags of a single-member throwaway etcd on 127.0.0.1.
func EtcdArgs(dataDir string, clientPort, peerPort int) []string {
	clientURL := fmt.Sprintf("http://127.0.0.1:%d", clientPort)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", peerPort)
	return []string{
		"--name", "testbed", "--data-dir", dataDir,
		"--listen-client-urls", clientURL, "--advertise-client-urls", clientURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "testbed=" + peerURL,
		// Throwaway data: durability only costs latency here.
		"--unsafe-no-fsync",
	}
}

// APIServerArgs are the flags of a kube-apiserver on 127.0.0.1:port backed
// by the etcd at etcdClientPort, with pki's certificates, RBAC and Node
// authorization.
func APIServerArgs(pki *PKI, etcdClientPort, port int, certDir string) []string {
	return []string{
		fmt.Sprintf("--etcd-servers=http://127.0.0.1:%d", etcdClientPort),
		"--bind-address=127.0.0.1", "--secure-port=" + strconv.Itoa(port), "--advertise-address=127.0.0.1",
		"--endpoint-reconciler-type=none",
		"--cert-dir=" + certDir,
		"--tls-cert-file=" + pki.Cert("apiserver"), "--tls-private-key-file=" + pki.Key("apiserver"),
		"--client-ca-file=" + pki.Cert("ca"),
		"--kubelet-client-certificate=" + pki.Cert("apiserver-kubelet-client"),
		"--kubelet-client-key=" + pki.Key("apiserver-kubelet-client"),
		"--kubelet-certificate-authority=" + pki.Cert("ca"),
		"--kubelet-preferred-address-types=Hostname",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + pki.path("sa.pub"),
		"--service-account-signing-key-file=" + pki.path("sa.key"),
		"--service-cluster-ip-range=10.96.0.0/16",
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction",
		"--allow-privileged=true",
		"--profiling=false",
	}
}

// FreePorts returns n distinct unused loopback TCP ports.
func FreePorts(n int) ([]int, error) { return freePorts(n) }
