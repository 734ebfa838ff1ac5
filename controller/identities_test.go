package controller

import (
	"fmt"
	"maps"
	"strconv"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
)

// TestIdentities: one Identity per security label set, shared by pods on
// different nodes and across excluded labels, separate per namespace;
// a namespace label change yields a new set; unused Identities are
// collected after the grace period and numbers are never handed out again,
// also by a new controller.
func TestIdentities(t *testing.T) {
	e := newEnv(t)
	e.namespace("shop", map[string]string{"team": "a"})
	e.namespace("bank", map[string]string{"team": "b"})
	ctl := e.start(testOptions(), "ident-1")

	// Same app on two nodes, different pod-template-hash and pod-name: one set.
	e.pod("shop", "web-1", "node-a", map[string]string{"app": "web", "pod-template-hash": "aaa", "statefulset.kubernetes.io/pod-name": "web-1"})
	e.pod("shop", "web-2", "node-b", map[string]string{"app": "web", "pod-template-hash": "bbb", "statefulset.kubernetes.io/pod-name": "web-2"})
	e.pod("bank", "web-1", "node-a", map[string]string{"app": "web"})
	e.pod("shop", "db-1", "node-a", map[string]string{"app": "db"})
	web := func(ns, team string) map[string]string {
		return map[string]string{"app": "web", coordinov1alpha1.NamespaceLabelPrefix + "team": team,
			coordinov1alpha1.NamespaceLabelPrefix + "kubernetes.io/metadata.name": ns}
	}
	var shopWeb int
	e.eventually("three Identities", 30*time.Second, func() error {
		ids, err := e.identities()
		if err != nil {
			return err
		}
		if len(ids) != 3 {
			return fmt.Errorf("identities %v", ids)
		}
		shopWeb = findIdentity(ids, "shop", web("shop", "a"))
		if shopWeb == 0 || findIdentity(ids, "bank", web("bank", "b")) == 0 {
			return fmt.Errorf("identities %v", ids)
		}
		return nil
	})
	for n := range mustIdentities(t, e) {
		if n < coordinov1alpha1.MinClusterIdentity || n > coordinov1alpha1.MaxClusterIdentity {
			t.Errorf("identity %d outside the cluster range", n)
		}
	}
	// Another replica of the same set adds no Identity and no write.
	e.pod("shop", "web-3", "node-c", map[string]string{"app": "web", "pod-template-hash": "ccc"})
	e.never("a fourth Identity for a known set", 2*time.Second, func() error {
		if ids, _ := e.identities(); len(ids) > 3 {
			return nil
		}
		return fmt.Errorf("no")
	})

	// A namespace label change gives its pods a new set.
	ns, err := e.core.CoreV1().Namespaces().Get(e.ctx, "shop", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ns.Labels["team"] = "c"
	if _, err := e.core.CoreV1().Namespaces().Update(e.ctx, ns, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.eventually("Identity for the relabelled namespace; the old one collected", 30*time.Second, func() error {
		ids, err := e.identities()
		if err != nil {
			return err
		}
		if findIdentity(ids, "shop", web("shop", "c")) == 0 {
			return fmt.Errorf("no identity for team=c: %v", ids)
		}
		if _, ok := ids[shopWeb]; ok {
			return fmt.Errorf("unused identity %d not collected", shopWeb)
		}
		return nil
	})

	// All pods gone: everything collected after the grace period.
	for _, p := range [][2]string{{"shop", "web-1"}, {"shop", "web-2"}, {"shop", "web-3"}, {"bank", "web-1"}, {"shop", "db-1"}} {
		e.deletePod(p[0], p[1])
	}
	highest := 0
	for n := range mustIdentities(t, e) {
		highest = max(highest, n)
	}
	e.eventually("all Identities collected", 30*time.Second, func() error {
		if ids, _ := e.identities(); len(ids) > 0 {
			return fmt.Errorf("left: %v", ids)
		}
		return nil
	})

	// A new controller (leader change) never hands out a collected number.
	ctl.stop()
	e.start(testOptions(), "ident-2")
	e.pod("bank", "api-1", "node-a", map[string]string{"app": "api"})
	e.eventually("new Identity above every earlier number", 30*time.Second, func() error {
		ids, err := e.identities()
		if err != nil || len(ids) != 1 {
			return fmt.Errorf("%v %v", ids, err)
		}
		for n := range ids {
			if n <= highest {
				return fmt.Errorf("number %d reused (earlier numbers up to %d)", n, highest)
			}
		}
		return nil
	})
}

type identityRec struct {
	namespace string
	labels    map[string]string
}

func (e *env) identities() (map[int]identityRec, error) {
	l, err := e.crd.CoordinoV1alpha1().Identities().List(e.ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	out := map[int]identityRec{}
	for _, id := range l.Items {
		n, _ := strconv.Atoi(id.Name)
		if id.Labels[coordinov1alpha1.LabelSetHashLabel] != coordinov1alpha1.LabelSetHash(id.Spec.Namespace, id.Spec.Labels) {
			return nil, fmt.Errorf("identity %s has a wrong hash label", id.Name)
		}
		out[n] = identityRec{id.Spec.Namespace, id.Spec.Labels}
	}
	return out, nil
}

func mustIdentities(t *testing.T, e *env) map[int]identityRec {
	ids, err := e.identities()
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

func findIdentity(ids map[int]identityRec, ns string, labels map[string]string) int {
	for n, r := range ids {
		if r.namespace == ns && maps.Equal(r.labels, labels) {
			return n
		}
	}
	return 0
}
