package testbed

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"time"
)

// Kube is a minimal Kubernetes REST client (client certificate auth). The
// tests need a handful of Pod calls; a hand-written client keeps client-go
// and its dependency tree out of the project's go.mod.
type Kube struct {
	server string
	hc     *http.Client
	stream *http.Client // no timeout, for watches
}

// StatusError is a non-2xx answer of the API server.
type StatusError struct {
	Code int
	Body string
}

func (e *StatusError) Error() string { return fmt.Sprintf("HTTP %d: %s", e.Code, e.Body) }

// IsNotFound and IsConflict classify API errors.
func IsNotFound(err error) bool {
	var se *StatusError
	return errors.As(err, &se) && se.Code == http.StatusNotFound
}
func IsConflict(err error) bool {
	var se *StatusError
	return errors.As(err, &se) && se.Code == http.StatusConflict
}

// NewKube returns a client for server trusting caFile.
func NewKube(server, caFile, certFile, keyFile string) (*Kube, error) {
	ca, err := os.ReadFile(caFile)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, err
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}}
	return &Kube{server: server, hc: &http.Client{Transport: tr, Timeout: 30 * time.Second}, stream: &http.Client{Transport: tr}}, nil
}

// Do sends in as JSON (when non-nil) and decodes the answer into out (when
// non-nil).
func (k *Kube) Do(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, k.server+path, body)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	resp, err := k.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		return &StatusError{Code: resp.StatusCode, Body: string(data)}
	}
	if out != nil {
		return json.Unmarshal(data, out)
	}
	return nil
}

// Pod is the subset of core/v1 Pod the tests read and write.
type Pod struct {
	APIVersion string    `json:"apiVersion,omitempty"`
	Kind       string    `json:"kind,omitempty"`
	Metadata   Meta      `json:"metadata"`
	Spec       PodSpec   `json:"spec"`
	Status     PodStatus `json:"status,omitempty"`
}

// Meta is the subset of ObjectMeta the tests use.
type Meta struct {
	Name              string            `json:"name,omitempty"`
	Namespace         string            `json:"namespace,omitempty"`
	UID               string            `json:"uid,omitempty"`
	ResourceVersion   string            `json:"resourceVersion,omitempty"`
	Labels            map[string]string `json:"labels,omitempty"`
	DeletionTimestamp *string           `json:"deletionTimestamp,omitempty"`
}

// PodSpec is the subset of core/v1 PodSpec the tests use.
type PodSpec struct {
	NodeName                      string      `json:"nodeName,omitempty"`
	RuntimeClassName              *string     `json:"runtimeClassName,omitempty"`
	TerminationGracePeriodSeconds *int64      `json:"terminationGracePeriodSeconds,omitempty"`
	AutomountServiceAccountToken  *bool       `json:"automountServiceAccountToken,omitempty"`
	Containers                    []Container `json:"containers"`
}

// Container is the subset of core/v1 Container the tests use.
type Container struct {
	Name            string   `json:"name"`
	Image           string   `json:"image"`
	ImagePullPolicy string   `json:"imagePullPolicy,omitempty"`
	Command         []string `json:"command,omitempty"`
}

// PodStatus is the subset of core/v1 PodStatus the tests read.
type PodStatus struct {
	Phase             string            `json:"phase,omitempty"`
	PodIP             string            `json:"podIP,omitempty"`
	ContainerStatuses []ContainerStatus `json:"containerStatuses,omitempty"`
}

// ContainerStatus is the subset of core/v1 ContainerStatus the tests read.
type ContainerStatus struct {
	Name         string `json:"name"`
	ContainerID  string `json:"containerID,omitempty"`
	Ready        bool   `json:"ready"`
	RestartCount int    `json:"restartCount"`
}

// PodList is core/v1 PodList.
type PodList struct {
	Metadata Meta  `json:"metadata"`
	Items    []Pod `json:"items"`
}

func podsPath(ns string) string { return "/api/v1/namespaces/" + ns + "/pods" }

// ProbePod returns a Pod running the probe server on the bed's node, on the
// network of runtimeClass ("" for the default handler).
func ProbePod(name, runtimeClass string, labels map[string]string) *Pod {
	grace, no := int64(1), false
	p := &Pod{APIVersion: "v1", Kind: "Pod",
		Metadata: Meta{Name: name, Namespace: "default", Labels: labels},
		Spec: PodSpec{NodeName: NodeName, TerminationGracePeriodSeconds: &grace, AutomountServiceAccountToken: &no,
			Containers: []Container{{Name: "probe", Image: ProbeImage, ImagePullPolicy: "Never",
				Command: []string{"/probe", "serve", "-port", "8080"}}}}}
	if runtimeClass != "" {
		p.Spec.RuntimeClassName = &runtimeClass
	}
	return p
}

// CreatePod creates p.
func (k *Kube) CreatePod(ctx context.Context, p *Pod) (*Pod, error) {
	var out Pod
	return &out, k.Do(ctx, "POST", podsPath(p.Metadata.Namespace), p, &out)
}

// GetPod reads a Pod.
func (k *Kube) GetPod(ctx context.Context, ns, name string) (*Pod, error) {
	var out Pod
	return &out, k.Do(ctx, "GET", podsPath(ns)+"/"+name, nil, &out)
}

// DeletePod deletes a Pod gracefully (kubelet finishes the deletion).
func (k *Kube) DeletePod(ctx context.Context, ns, name string) error {
	err := k.Do(ctx, "DELETE", podsPath(ns)+"/"+name, nil, nil)
	if IsNotFound(err) {
		return nil
	}
	return err
}

// ListPods lists Pods matching a label selector.
func (k *Kube) ListPods(ctx context.Context, ns, selector string) (*PodList, error) {
	var out PodList
	return &out, k.Do(ctx, "GET", podsPath(ns)+"?labelSelector="+url.QueryEscape(selector), nil, &out)
}

// WatchPods streams Pod events matching selector from resourceVersion rv and
// calls fn for each until fn returns false or ctx ends.
func (k *Kube) WatchPods(ctx context.Context, ns, selector, rv string, fn func(typ string, p *Pod) bool) error {
	q := url.Values{"watch": {"1"}, "labelSelector": {selector}, "resourceVersion": {rv}, "allowWatchBookmarks": {"false"}}
	req, err := http.NewRequestWithContext(ctx, "GET", k.server+podsPath(ns)+"?"+q.Encode(), nil)
	if err != nil {
		return err
	}
	resp, err := k.stream.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return &StatusError{Code: resp.StatusCode, Body: string(b)}
	}
	dec := json.NewDecoder(bufio.NewReader(resp.Body))
	for {
		var ev struct {
			Type   string `json:"type"`
			Object Pod    `json:"object"`
		}
		if err := dec.Decode(&ev); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if !fn(ev.Type, &ev.Object) {
			return nil
		}
	}
}

// NodeReady returns nil when the node's Ready condition is True.
func (k *Kube) NodeReady(ctx context.Context, name string) error {
	var n struct {
		Status struct {
			Conditions []struct{ Type, Status, Reason, Message string } `json:"conditions"`
		} `json:"status"`
	}
	if err := k.Do(ctx, "GET", "/api/v1/nodes/"+name, nil, &n); err != nil {
		return err
	}
	for _, c := range n.Status.Conditions {
		if c.Type == "Ready" {
			if c.Status == "True" {
				return nil
			}
			return fmt.Errorf("node %s not ready: %s: %s", name, c.Reason, c.Message)
		}
	}
	return fmt.Errorf("node %s has no Ready condition yet", name)
}
