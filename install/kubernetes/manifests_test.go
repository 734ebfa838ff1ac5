package kubernetes

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// render builds a kustomize tree and decodes every object strictly: an
// unknown or duplicated field, or a kind the API does not know, fails.
func render(t *testing.T, dir string) []runtime.Object {
	t.Helper()
	resMap, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	decoder := serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict).UniversalDeserializer()
	var objs []runtime.Object
	for _, res := range resMap.Resources() {
		y, err := res.AsYAML()
		if err != nil {
			t.Fatalf("%s: %s: %v", dir, res.CurId(), err)
		}
		j, err := yaml.YAMLToJSON(y)
		if err != nil {
			t.Fatalf("%s: %s: %v", dir, res.CurId(), err)
		}
		obj, _, err := decoder.Decode(j, nil, nil)
		if err != nil {
			t.Fatalf("%s: %s does not decode strictly: %v", dir, res.CurId(), err)
		}
		objs = append(objs, obj)
	}
	return objs
}

func only[T runtime.Object](objs []runtime.Object) []T {
	var out []T
	for _, o := range objs {
		if v, ok := o.(T); ok {
			out = append(out, v)
		}
	}
	return out
}

func container(t *testing.T, cs []corev1.Container, name string) corev1.Container {
	t.Helper()
	for _, c := range cs {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no container %q", name)
	return corev1.Container{}
}

func TestBaseRenders(t *testing.T) {
	objs := render(t, "base")
	var kinds []string
	for _, o := range objs {
		kinds = append(kinds, fmt.Sprintf("%T", o))
	}
	slices.Sort(kinds)
	want := []string{"*v1.ClusterRole", "*v1.ClusterRoleBinding", "*v1.DaemonSet", "*v1.Namespace", "*v1.ServiceAccount"}
	if !slices.Equal(kinds, want) {
		t.Fatalf("base renders %v, want %v", kinds, want)
	}
}

func TestOverlays(t *testing.T) {
	for _, mode := range []string{"primary", "chained"} {
		t.Run(mode, func(t *testing.T) {
			objs := render(t, "overlays/"+mode)
			checkNamespaced(t, objs, "coordino-system")
			checkRBAC(t, objs)
			dss := only[*appsv1.DaemonSet](objs)
			if len(dss) != 1 {
				t.Fatalf("%d DaemonSets", len(dss))
			}
			ds := dss[0]
			spec := ds.Spec.Template.Spec
			checkPodBasics(t, ds)

			// The installer runs in the overlay's mode, once as an init
			// container and then as the watcher; nothing uninstalls.
			install := container(t, spec.InitContainers, "install-cni")
			watch := container(t, spec.Containers, "cni-watch")
			for _, c := range []corev1.Container{install, watch} {
				if n := countPrefix(c.Args, "--mode="); n != 1 || !slices.Contains(c.Args, "--mode="+mode) {
					t.Errorf("%s args %v: want exactly --mode=%s", c.Name, c.Args, mode)
				}
				if slices.Contains(c.Args, "--uninstall") {
					t.Errorf("%s uninstalls on every pod start/stop", c.Name)
				}
				if c.Lifecycle != nil {
					t.Errorf("%s has lifecycle hooks", c.Name)
				}
			}
			if !slices.Contains(watch.Args, "--watch") || slices.Contains(install.Args, "--watch") {
				t.Errorf("--watch belongs to cni-watch only: init %v, watch %v", install.Args, watch.Args)
			}
			if install.SecurityContext == nil || install.SecurityContext.Privileged == nil || !*install.SecurityContext.Privileged {
				t.Error("install-cni must be privileged")
			}
			daemon := container(t, spec.Containers, "daemon")
			if daemon.Lifecycle != nil {
				t.Error("daemon has lifecycle hooks; uninstall must be explicit")
			}
			checkDaemon(t, daemon)
			checkMounts(t, spec)
		})
	}
}

func TestUninstallKit(t *testing.T) {
	objs := render(t, "uninstall")
	checkNamespaced(t, objs, "coordino-uninstall")
	if n := len(only[*rbacv1.ClusterRole](objs)) + len(only[*rbacv1.Role](objs)); n != 0 {
		t.Fatalf("uninstall kit grants API access (%d roles)", n)
	}
	ds := only[*appsv1.DaemonSet](objs)[0]
	spec := ds.Spec.Template.Spec
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		t.Error("uninstall pods need no API token")
	}
	if !tolerateAll(spec.Tolerations) {
		t.Error("uninstall must reach every node")
	}
	for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
		if !slices.Contains(c.Args, "--uninstall") {
			t.Errorf("%s args %v lack --uninstall", c.Name, c.Args)
		}
	}
	if !slices.Contains(container(t, spec.Containers, "hold").Args, "--hold") {
		t.Error("main container must hold so rollout status means done")
	}
	// The datapath and pins go too: on the node's interfaces, by a privileged container.
	init := container(t, spec.InitContainers, "uninstall-cni")
	if !slices.Contains(init.Args, "--remove-node-state") || !spec.HostNetwork ||
		init.SecurityContext == nil || init.SecurityContext.Privileged == nil || !*init.SecurityContext.Privileged {
		t.Errorf("uninstall-cni must remove node state privileged in the host network: args %v hostNetwork %v", init.Args, spec.HostNetwork)
	}
	checkMounts(t, spec)
}

func countPrefix(args []string, prefix string) int {
	n := 0
	for _, a := range args {
		if strings.HasPrefix(a, prefix) {
			n++
		}
	}
	return n
}

func tolerateAll(ts []corev1.Toleration) bool {
	return slices.ContainsFunc(ts, func(t corev1.Toleration) bool {
		return t.Operator == corev1.TolerationOpExists && t.Key == "" && t.Effect == ""
	})
}

func checkNamespaced(t *testing.T, objs []runtime.Object, ns string) {
	t.Helper()
	for _, o := range objs {
		m, ok := o.(interface{ GetNamespace() string })
		if !ok {
			continue
		}
		switch o.(type) {
		case *corev1.Namespace, *rbacv1.ClusterRole, *rbacv1.ClusterRoleBinding:
			continue
		}
		if m.GetNamespace() != ns {
			t.Errorf("%T in namespace %q, want %q", o, m.GetNamespace(), ns)
		}
	}
}

// checkRBAC: read-only, no wildcards, and the binding grants exactly the
// daemon's role to the DaemonSet's service account.
func checkRBAC(t *testing.T, objs []runtime.Object) {
	t.Helper()
	readOnly := []string{"get", "list", "watch"}
	roles := only[*rbacv1.ClusterRole](objs)
	if len(roles) != 1 || len(only[*rbacv1.Role](objs)) != 0 {
		t.Fatalf("want one ClusterRole, got %d", len(roles))
	}
	for i, r := range roles[0].Rules {
		for _, list := range [][]string{r.APIGroups, r.Resources, r.Verbs, r.ResourceNames, r.NonResourceURLs} {
			if slices.Contains(list, "*") {
				t.Errorf("rule %d has a wildcard: %+v", i, r)
			}
		}
		for _, v := range r.Verbs {
			if !slices.Contains(readOnly, v) {
				t.Errorf("rule %d grants %q on %v %v: the daemon only reads", i, v, r.APIGroups, r.Resources)
			}
		}
		for _, res := range r.Resources {
			if res == "secrets" || strings.Contains(res, "/") {
				t.Errorf("rule %d grants %q", i, res)
			}
		}
	}
	for _, want := range []struct{ group, res string }{{"", "pods"}, {"", "namespaces"}, {"", "nodes"}, {"networking.k8s.io", "networkpolicies"}} {
		if !slices.ContainsFunc(roles[0].Rules, func(r rbacv1.PolicyRule) bool {
			return slices.Contains(r.APIGroups, want.group) && slices.Contains(r.Resources, want.res) && slices.Equal(r.Verbs, readOnly)
		}) {
			t.Errorf("no get/list/watch on %s %s", want.group, want.res)
		}
	}
	bindings := only[*rbacv1.ClusterRoleBinding](objs)
	if len(bindings) != 1 {
		t.Fatalf("want one ClusterRoleBinding, got %d", len(bindings))
	}
	b := bindings[0]
	ds := only[*appsv1.DaemonSet](objs)[0]
	sas := only[*corev1.ServiceAccount](objs)
	if b.RoleRef.Kind != "ClusterRole" || b.RoleRef.Name != roles[0].Name {
		t.Errorf("binding refers to %s/%s", b.RoleRef.Kind, b.RoleRef.Name)
	}
	if len(b.Subjects) != 1 || b.Subjects[0].Kind != "ServiceAccount" || b.Subjects[0].Name != ds.Spec.Template.Spec.ServiceAccountName ||
		b.Subjects[0].Namespace != ds.Namespace || len(sas) != 1 || sas[0].Name != b.Subjects[0].Name {
		t.Errorf("binding subjects %+v do not match the DaemonSet's service account %q", b.Subjects, ds.Spec.Template.Spec.ServiceAccountName)
	}
}

func checkPodBasics(t *testing.T, ds *appsv1.DaemonSet) {
	t.Helper()
	spec := ds.Spec.Template.Spec
	if !spec.HostNetwork || spec.DNSPolicy != corev1.DNSClusterFirstWithHostNet {
		t.Error("daemon must use the host network with ClusterFirstWithHostNet DNS")
	}
	if spec.PriorityClassName != "system-node-critical" {
		t.Errorf("priorityClassName %q", spec.PriorityClassName)
	}
	if !tolerateAll(spec.Tolerations) {
		t.Errorf("tolerations %+v do not tolerate every taint", spec.Tolerations)
	}
	for k, v := range ds.Spec.Selector.MatchLabels {
		if ds.Spec.Template.Labels[k] != v {
			t.Errorf("selector %s=%s does not match the template", k, v)
		}
	}
	if ds.Spec.UpdateStrategy.Type != appsv1.RollingUpdateDaemonSetStrategyType {
		t.Errorf("update strategy %q", ds.Spec.UpdateStrategy.Type)
	}
}

// checkDaemon: probes hit /healthz and /readyz on the port the daemon is
// told to serve metrics on.
func checkDaemon(t *testing.T, c corev1.Container) {
	t.Helper()
	if c.SecurityContext == nil || c.SecurityContext.Privileged == nil || !*c.SecurityContext.Privileged {
		t.Error("daemon must be privileged")
	}
	var addr string
	for _, a := range c.Args {
		if v, ok := strings.CutPrefix(a, "--metrics-addr="); ok {
			addr = v
		}
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("--metrics-addr %q: %v", addr, err)
	}
	var metricsPort int32
	for _, p := range c.Ports {
		if p.Name == "metrics" {
			metricsPort = p.ContainerPort
		}
	}
	if fmt.Sprint(metricsPort) != port {
		t.Fatalf("metrics containerPort %d != --metrics-addr port %s", metricsPort, port)
	}
	for _, p := range []struct {
		probe *corev1.Probe
		path  string
	}{{c.LivenessProbe, "/healthz"}, {c.ReadinessProbe, "/readyz"}, {c.StartupProbe, "/healthz"}} {
		if p.probe == nil || p.probe.HTTPGet == nil {
			t.Fatalf("missing HTTP probe for %s", p.path)
		}
		g := p.probe.HTTPGet
		if g.Path != p.path || !(g.Port.StrVal == "metrics" || g.Port.IntVal == metricsPort) {
			t.Errorf("probe %s:%s, want %s on the metrics port", g.Path, g.Port.String(), p.path)
		}
	}
	env := map[string]string{}
	for _, e := range c.Env {
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
			env[e.Name] = e.ValueFrom.FieldRef.FieldPath
		}
	}
	if env["NODE_NAME"] != "spec.nodeName" {
		t.Error("NODE_NAME must come from the downward API")
	}
	mounts := map[string]corev1.VolumeMount{}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = m
	}
	for path, prop := range map[string]corev1.MountPropagationMode{
		"/run/coordino":     corev1.MountPropagationBidirectional,
		"/sys/fs/bpf":       corev1.MountPropagationBidirectional,
		"/run/netns":        corev1.MountPropagationHostToContainer,
		"/var/lib/coordino": "",
	} {
		m, ok := mounts[path]
		if !ok {
			t.Errorf("daemon does not mount %s", path)
			continue
		}
		got := corev1.MountPropagationMode("")
		if m.MountPropagation != nil {
			got = *m.MountPropagation
		}
		if got != prop {
			t.Errorf("%s propagation %q, want %q", path, got, prop)
		}
	}
}

// checkMounts: every mount names a hostPath volume, host paths are the ones
// the installer and daemon flags expect, and Bidirectional propagation is only
// used by privileged containers (the API server refuses it otherwise).
func checkMounts(t *testing.T, spec corev1.PodSpec) {
	t.Helper()
	hostPath := map[string]string{}
	for _, v := range spec.Volumes {
		if v.HostPath == nil {
			t.Errorf("volume %s is not a hostPath", v.Name)
			continue
		}
		hostPath[v.Name] = v.HostPath.Path
	}
	for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
		privileged := c.SecurityContext != nil && c.SecurityContext.Privileged != nil && *c.SecurityContext.Privileged
		for _, m := range c.VolumeMounts {
			hp, ok := hostPath[m.Name]
			if !ok {
				t.Errorf("%s mounts unknown volume %s", c.Name, m.Name)
			}
			if m.MountPropagation != nil && *m.MountPropagation == corev1.MountPropagationBidirectional && !privileged {
				t.Errorf("%s: Bidirectional mount %s in an unprivileged container", c.Name, m.MountPath)
			}
			// The installer sees host dirs under /host; the daemon at their real paths.
			if want := strings.TrimPrefix(m.MountPath, "/host"); hp != want {
				t.Errorf("%s mounts host %s at %s", c.Name, hp, m.MountPath)
			}
		}
		for _, a := range c.Args {
			for _, flag := range []string{"--cni-bin-dir=", "--cni-conf-dir=", "--run-dir=", "--state-dir=", "--bpf-dir="} {
				dir, ok := strings.CutPrefix(a, flag)
				if ok && !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool {
					return dir == m.MountPath || strings.HasPrefix(dir, m.MountPath+"/")
				}) {
					t.Errorf("%s: %s is not on a mounted host path", c.Name, a)
				}
			}
		}
	}
}

// TestNodeLocalMetricsComponent: the component moves the metrics listener to
// loopback and points every probe there, on top of either mode's overlay.
func TestNodeLocalMetricsComponent(t *testing.T) {
	abs, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, overlay := range []string{"primary", "chained"} {
		dir := t.TempDir()
		// kustomize takes only relative paths to other kustomizations.
		res, _ := filepath.Rel(dir, filepath.Join(abs, "overlays", overlay))
		comp, _ := filepath.Rel(dir, filepath.Join(abs, "components", "node-local-metrics"))
		k := fmt.Sprintf("resources: [%s]\ncomponents: [%s]\n", res, comp)
		if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o600); err != nil {
			t.Fatal(err)
		}
		ds := only[*appsv1.DaemonSet](render(t, dir))[0]
		d := container(t, ds.Spec.Template.Spec.Containers, "daemon")
		if !slices.Contains(d.Args, "--metrics-addr=127.0.0.1:9190") || slices.Contains(d.Args, "--metrics-addr=0.0.0.0:9190") {
			t.Fatalf("%s: daemon args %v", overlay, d.Args)
		}
		for name, p := range map[string]*corev1.Probe{"startup": d.StartupProbe, "liveness": d.LivenessProbe, "readiness": d.ReadinessProbe} {
			if p == nil || p.HTTPGet == nil || p.HTTPGet.Host != "127.0.0.1" {
				t.Fatalf("%s: %s probe does not target 127.0.0.1: %+v", overlay, name, p)
			}
		}
	}
}
