package apiserver

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	yamlutil "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/coordino/coordino/test/privileged"
	"github.com/coordino/coordino/test/testbed"
)

// Server is a running etcd + kube-apiserver pair.
type Server struct {
	// Config is an admin (system:masters) client configuration.
	Config *rest.Config
	// Kubeconfig is the path of the same admin credentials as a kubeconfig
	// file (for binaries under test and kubectl).
	Kubeconfig string
	// URL is https://127.0.0.1:PORT.
	URL string

	t         testing.TB
	dir       string
	etcdURL   string
	pki       *testbed.PKI
	etcd      *testbed.Proc
	apiServer *testbed.Proc
}

// Options tune Start.
type Options struct {
	// NoCRDs skips installing api/crds.
	NoCRDs bool
}

// Start starts etcd and kube-apiserver and installs the CRDs, or skips the
// test (fails under CI=true) when the binaries are missing.
func Start(t testing.TB) *Server { return StartWith(t, Options{}) }

// StartWith is Start with options.
func StartWith(t testing.TB, opts Options) *Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cache := os.Getenv("COORDINO_TESTBED_CACHE")
	if cache == "" {
		cache = "/var/cache/coordino-testbed"
	}
	etcdBin, apiBin, err := waitForBinaries(ctx, t, cache)
	if err != nil {
		unavailable(t, err)
	}
	// /tmp, not t.TempDir(): the directory outlives the test binary if it
	// is killed, and its processes must be easy to find by their logs.
	dir, err := os.MkdirTemp("", "coordino-apiserver-")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{t: t, dir: dir}
	t.Cleanup(s.stop)
	if s.pki, err = testbed.NewPKI(filepath.Join(dir, "pki"), "localhost"); err != nil {
		t.Fatal(err)
	}
	ports, err := testbed.FreePorts(3)
	if err != nil {
		t.Fatal(err)
	}
	s.URL = fmt.Sprintf("https://127.0.0.1:%d", ports[2])
	s.etcdURL = fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	s.etcd = &testbed.Proc{Name: "etcd", Path: etcdBin, Args: testbed.EtcdArgs(filepath.Join(dir, "etcd"), ports[0], ports[1]),
		LogPath: filepath.Join(dir, "etcd.log")}
	s.apiServer = &testbed.Proc{Name: "kube-apiserver", Path: apiBin,
		Args:    testbed.APIServerArgs(s.pki, ports[0], ports[2], filepath.Join(dir, "apiserver-certs")),
		LogPath: filepath.Join(dir, "kube-apiserver.log")}
	if err := s.etcd.Start(filepath.Join(dir, "pids")); err != nil {
		unavailable(t, err)
	}
	if s.Kubeconfig, err = s.pki.Kubeconfig("admin", s.URL); err != nil {
		t.Fatal(err)
	}
	if s.Config, err = clientcmd.BuildConfigFromFlags("", s.Kubeconfig); err != nil {
		t.Fatal(err)
	}
	s.Config.QPS, s.Config.Burst = 500, 1000
	if err := s.StartAPIServer(ctx); err != nil {
		unavailable(t, err)
	}
	if !opts.NoCRDs {
		if err := s.InstallCRDs(ctx); err != nil {
			t.Fatalf("install CRDs: %v", err)
		}
	}
	return s
}

// unavailable fails under CI (where the binaries must be there) and skips
// elsewhere.
func unavailable(t testing.TB, err error) {
	t.Helper()
	privileged.Needs(t, "kube-apiserver test environment unavailable: %v", err)
}

// waitForBinaries returns the cached binaries, waiting for a build that is
// under way (build.sh's temp directory exists) to finish.
func waitForBinaries(ctx context.Context, t testing.TB, cache string) (string, string, error) {
	for {
		etcd, api, err := testbed.ControlPlaneBinaries(cache)
		if err == nil {
			return etcd, api, nil
		}
		building, _ := filepath.Glob(filepath.Join(cache, ".tmp-*"))
		if len(building) == 0 {
			return "", "", err
		}
		t.Logf("waiting for the build in %v", building)
		select {
		case <-ctx.Done():
			return "", "", fmt.Errorf("%w (a build is still running in %v)", err, building)
		case <-time.After(5 * time.Second):
		}
	}
}

// StartAPIServer (re)starts kube-apiserver on the same port and etcd, and
// waits for /readyz. Tests of API outages pair it with StopAPIServer.
func (s *Server) StartAPIServer(ctx context.Context) error {
	p := s.apiServer
	s.apiServer = &testbed.Proc{Name: p.Name, Path: p.Path, Args: p.Args, LogPath: p.LogPath}
	if err := s.apiServer.Start(filepath.Join(s.dir, "pids")); err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(s.Config)
	if err != nil {
		return err
	}
	return testbed.WaitFor(ctx, "kube-apiserver /readyz", 90*time.Second, func() error {
		if !s.apiServer.Running() {
			return fmt.Errorf("kube-apiserver exited, see %s", s.apiServer.LogPath)
		}
		return cs.Discovery().RESTClient().Get().AbsPath("/readyz").Do(ctx).Error()
	})
}

// Stored returns the bytes etcd holds for an object of a custom resource
// (group/plural/name, or group/plural/namespace/name), as the API server
// wrote them: a CRD's objects are JSON in the storage version of the
// time. Read through etcd's JSON gateway, so no etcd client is needed.
func (s *Server) Stored(ctx context.Context, key string) ([]byte, error) {
	body, _ := json.Marshal(map[string]string{"key": base64.StdEncoding.EncodeToString([]byte("/registry/" + key))})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.etcdURL+"/v3/kv/range", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var out struct {
		KVs []struct {
			Value []byte `json:"value"` // base64 in JSON
		} `json:"kvs"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, fmt.Errorf("etcd range %s: %w", key, err)
	}
	if len(out.KVs) != 1 {
		return nil, fmt.Errorf("etcd holds no /registry/%s", key)
	}
	return out.KVs[0].Value, nil
}

// StopAPIServer stops kube-apiserver (etcd keeps its data).
func (s *Server) StopAPIServer() { _ = s.apiServer.Stop(10 * time.Second) }

func (s *Server) stop() {
	if s.apiServer != nil {
		_ = s.apiServer.Stop(10 * time.Second)
	}
	if s.etcd != nil {
		_ = s.etcd.Stop(10 * time.Second)
	}
	if s.t.Failed() {
		s.t.Logf("kept logs of the failed test in %s", s.dir)
		return
	}
	_ = os.RemoveAll(s.dir)
}

// CRDDir is api/crds of the repository the test runs in.
func CRDDir() (string, error) {
	d, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(d, "api", "crds")); err == nil {
			if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
				return filepath.Join(d, "api", "crds"), nil
			}
		}
		parent := filepath.Dir(d)
		if parent == d {
			return "", fmt.Errorf("api/crds not found above the working directory")
		}
		d = parent
	}
}

var crdResource = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// InstallCRDs creates every CRD in api/crds (Coordino's and the upstream
// ClusterNetworkPolicy) and waits until each is
// Established.
func (s *Server) InstallCRDs(ctx context.Context) error {
	dir, err := CRDDir()
	if err != nil {
		return err
	}
	files, err := filepath.Glob(filepath.Join(dir, "*_*.yaml"))
	if err != nil || len(files) == 0 {
		return fmt.Errorf("no CRDs in %s: %v", dir, err)
	}
	dyn, err := dynamic.NewForConfig(s.Config)
	if err != nil {
		return err
	}
	var names []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		obj := &unstructured.Unstructured{}
		if err := yamlutil.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096).Decode(&obj.Object); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		if _, err := dyn.Resource(crdResource).Create(ctx, obj, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("%s: %w", f, err)
		}
		names = append(names, obj.GetName())
	}
	for _, n := range names {
		err := testbed.WaitFor(ctx, "CRD "+n+" Established", 30*time.Second, func() error {
			o, err := dyn.Resource(crdResource).Get(ctx, n, metav1.GetOptions{})
			if err != nil {
				return err
			}
			conds, _, _ := unstructured.NestedSlice(o.Object, "status", "conditions")
			for _, c := range conds {
				m, _ := c.(map[string]any)
				if m["type"] == "Established" && m["status"] == "True" {
					return nil
				}
			}
			return fmt.Errorf("not established yet")
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// ServiceAccountConfig returns a client configuration authenticated as the
// service account namespace/name (created, with its namespace, if absent),
// via a TokenRequest: what a pod of that account gets, for RBAC tests.
func (s *Server) ServiceAccountConfig(ctx context.Context, namespace, name string) (*rest.Config, error) {
	return s.token(ctx, namespace, name, nil)
}

// PodServiceAccountConfig is ServiceAccountConfig for the pod's service
// account with the token bound to the pod, as kubelet mounts it: the API
// server then knows the pod's node (userInfo.extra
// authentication.kubernetes.io/node-name) when the pod is bound to one.
func (s *Server) PodServiceAccountConfig(ctx context.Context, pod *corev1.Pod) (*rest.Config, error) {
	sa := pod.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	return s.token(ctx, pod.Namespace, sa, &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID})
}

func (s *Server) token(ctx context.Context, namespace, name string, bound *authenticationv1.BoundObjectReference) (*rest.Config, error) {
	cs, err := kubernetes.NewForConfig(s.Config)
	if err != nil {
		return nil, err
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, err
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}}
	if _, err := cs.CoreV1().ServiceAccounts(namespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, err
	}
	exp := int64(3600)
	tr, err := cs.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &exp, BoundObjectRef: bound}}, metav1.CreateOptions{})
	if err != nil {
		return nil, err
	}
	cfg := rest.AnonymousClientConfig(s.Config)
	cfg.BearerToken = tr.Status.Token
	return cfg, nil
}

// Logs returns the kube-apiserver log (for failure messages).
func (s *Server) Logs() string {
	b, _ := os.ReadFile(s.apiServer.LogPath)
	return strings.TrimSpace(string(b))
}
