package controlplane

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"

	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
	"github.com/coordino/coordino/api/policyir"
	"github.com/coordino/coordino/daemon/nodeiso"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	cnpv1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
	"sigs.k8s.io/yaml"
)

// MaxFileSize bounds a policy file; larger files are rejected unread.
const MaxFileSize = 4 << 20

// Objects are the policy objects of one file.
type Objects struct {
	Policies        []*networkingv1.NetworkPolicy
	ClusterPolicies []*cnpv1beta1.ClusterNetworkPolicy
	Namespaces      []*corev1.Namespace
	NodeIsolation   []*coordinov1alpha1.NodeIsolationPolicy
	// Nodes give ClusterNetworkPolicy nodes peers the labels and
	// addresses of the cluster's nodes.
	Nodes []*corev1.Node
}

// ParseFile parses a YAML or JSON file of networking.k8s.io/v1
// NetworkPolicy, policy.networking.k8s.io/v1beta1 ClusterNetworkPolicy,
// v1 Namespace, v1 Node and coordino.io/v1alpha1 NodeIsolationPolicy documents
// separated by "---". Every error
// names the file, the document and, where it can, the field.
func ParseFile(name string, data []byte) (*Objects, error) {
	if len(data) > MaxFileSize {
		return nil, fmt.Errorf("policy file %q: %d bytes exceeds the %d byte limit", name, len(data), MaxFileSize)
	}
	out := &Objects{}
	rd := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for doc := 1; ; doc++ {
		raw, err := rd.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("policy file %q: document %d: %w", name, doc, err)
		}
		if isBlank(raw) {
			continue
		}
		if err := parseDoc(raw, out); err != nil {
			return nil, fmt.Errorf("policy file %q: document %d: %w", name, doc, err)
		}
	}
}

func parseDoc(raw []byte, out *Objects) error {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(raw, &tm); err != nil {
		return fmt.Errorf("not a Kubernetes object: %w", err)
	}
	switch {
	case tm.Kind == "NetworkPolicy" && tm.APIVersion == "networking.k8s.io/v1":
		np := &networkingv1.NetworkPolicy{}
		if err := yaml.UnmarshalStrict(raw, np); err != nil {
			return fmt.Errorf("NetworkPolicy: %w", err)
		}
		if np.Namespace == "" {
			np.Namespace = "default"
		}
		if err := policyir.ValidateNetworkPolicy(np); err != nil {
			return fmt.Errorf("NetworkPolicy %s/%s: %w", np.Namespace, np.Name, err)
		}
		out.Policies = append(out.Policies, np)
	case tm.Kind == "ClusterNetworkPolicy" && tm.APIVersion == cnpv1beta1.GroupVersion.String():
		cnp := &cnpv1beta1.ClusterNetworkPolicy{}
		if err := yaml.UnmarshalStrict(raw, cnp); err != nil {
			return fmt.Errorf("ClusterNetworkPolicy: %w", err)
		}
		if _, err := policyir.NormalizeCluster(cnp); err != nil {
			return err
		}
		out.ClusterPolicies = append(out.ClusterPolicies, cnp)
	case tm.Kind == "Namespace" && tm.APIVersion == "v1":
		ns := &corev1.Namespace{}
		if err := yaml.UnmarshalStrict(raw, ns); err != nil {
			return fmt.Errorf("Namespace: %w", err)
		}
		if err := policyir.ValidateNamespace(ns); err != nil {
			return fmt.Errorf("Namespace: %w", err)
		}
		out.Namespaces = append(out.Namespaces, ns)
	case tm.Kind == "Node" && tm.APIVersion == "v1":
		n := &corev1.Node{}
		if err := yaml.UnmarshalStrict(raw, n); err != nil {
			return fmt.Errorf("Node: %w", err)
		}
		if err := policyir.ValidateNode(n); err != nil {
			return fmt.Errorf("Node %s: %w", n.Name, err)
		}
		out.Nodes = append(out.Nodes, n)
	case tm.Kind == "NodeIsolationPolicy" && tm.APIVersion == coordinov1alpha1.SchemeGroupVersion.String():
		nip := &coordinov1alpha1.NodeIsolationPolicy{}
		if err := yaml.UnmarshalStrict(raw, nip); err != nil {
			return fmt.Errorf("NodeIsolationPolicy: %w", err)
		}
		if err := nodeiso.Validate(nip); err != nil {
			return err
		}
		out.NodeIsolation = append(out.NodeIsolation, nip)
	default:
		return fmt.Errorf("apiVersion %q kind %q: want networking.k8s.io/v1 NetworkPolicy, policy.networking.k8s.io/v1beta1 ClusterNetworkPolicy, v1 Namespace, v1 Node or coordino.io/v1alpha1 NodeIsolationPolicy", tm.APIVersion, tm.Kind)
	}
	return nil
}

// isBlank reports whether a document holds only whitespace and comments.
func isBlank(doc []byte) bool {
	for _, line := range strings.Split(string(doc), "\n") {
		line = strings.TrimSpace(line)
		if line != "" && !strings.HasPrefix(line, "#") && line != "---" {
			return false
		}
	}
	return true
}
