package cluster

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/yaml"

	"github.com/coordino/coordino/test/testbed"
)

// TestParseDatapathInfo: the sample of value 1 is the node's choice; a
// daemon without the metric, or with two choices, is an error, not a pass.
func TestParseDatapathInfo(t *testing.T) {
	const metrics = `# HELP coordino_datapath_info 1 for the datapath enforcing policy
# TYPE coordino_datapath_info gauge
coordino_datapath_info{datapath="nftables",fallback="false"} 1
coordino_endpoints 3
`
	got, err := parseDatapathInfo(strings.NewReader(metrics))
	if err != nil || got.Datapath != "nftables" || got.Fallback {
		t.Fatalf("parse = %+v, %v; want nftables without fallback", got, err)
	}
	got, err = parseDatapathInfo(strings.NewReader(`coordino_datapath_info{datapath="nftables",fallback="true"} 1` + "\n"))
	if err != nil || got.Datapath != "nftables" || !got.Fallback {
		t.Fatalf("parse fallback = %+v, %v", got, err)
	}
	for name, text := range map[string]string{
		"no metric": "coordino_endpoints 3\n",
		"value 0":   `coordino_datapath_info{datapath="ebpf",fallback="false"} 0` + "\n",
		"two":       `coordino_datapath_info{datapath="ebpf",fallback="false"} 1` + "\n" + `coordino_datapath_info{datapath="nftables",fallback="false"} 1` + "\n",
	} {
		if got, err := parseDatapathInfo(strings.NewReader(text)); err == nil {
			t.Errorf("%s: parse = %+v, want an error", name, got)
		}
	}
}

func TestCheckDatapathOption(t *testing.T) {
	for _, ok := range []string{"", "ebpf", "nftables", "auto"} {
		if err := checkDatapath(ok); err != nil {
			t.Errorf("checkDatapath(%q) = %v", ok, err)
		}
	}
	if err := checkDatapath("iptables"); err == nil || !strings.Contains(err.Error(), "Datapath") {
		t.Errorf("checkDatapath(iptables) = %v, want an error naming Datapath", err)
	}
}

// TestKustomizationAddsDatapath: the bed's kustomization, built by the
// cached kubectl, is the primary overlay with --datapath on the daemon
// container only.
func TestKustomizationAddsDatapath(t *testing.T) {
	cache := testbed.EnvOr("COORDINO_TESTBED_CACHE", "/var/cache/coordino-testbed")
	kubectls, _ := filepath.Glob(filepath.Join(cache, "kubectl-*", "kubectl"))
	if len(kubectls) == 0 {
		if os.Getenv("CI") == "true" {
			t.Fatalf("no kubectl under %s (test/testbed/build.sh cluster)", cache)
		}
		t.Skipf("no kubectl under %s (test/testbed/build.sh cluster)", cache)
	}
	root, err := testbed.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	c := &Cluster{Options: Options{Dir: t.TempDir(), Datapath: "nftables", Routing: "bgp",
		Overlay: filepath.Join(root, "install", "kubernetes", "overlays", "primary")}}
	dir, err := c.kustomization()
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(kubectls[0], "kustomize", dir).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl kustomize %s: %v: %s", dir, err, out)
	}
	var ds *appsv1.DaemonSet
	for _, doc := range strings.Split(string(out), "\n---\n") {
		if strings.Contains(doc, "kind: DaemonSet") && strings.Contains(doc, "name: coordino\n") {
			ds = &appsv1.DaemonSet{}
			if err := yaml.Unmarshal([]byte(doc), ds); err != nil {
				t.Fatal(err)
			}
		}
	}
	if ds == nil {
		t.Fatalf("no coordino DaemonSet in:\n%s", out)
	}
	for _, flag := range []string{"--datapath=nftables", "--routing=bgp"} {
		for _, ctr := range ds.Spec.Template.Spec.Containers {
			has := false
			for _, a := range ctr.Args {
				has = has || a == flag
			}
			if has != (ctr.Name == "daemon") {
				t.Errorf("container %s args %v: %s present %t, want it on the daemon only", ctr.Name, ctr.Args, flag, has)
			}
		}
	}
}
