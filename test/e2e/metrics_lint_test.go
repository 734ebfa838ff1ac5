package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/coordino/coordino/test/harness"
	"github.com/coordino/coordino/test/privileged"
)

// TestMetricsPassPromtoolLint checks every metric a daemon with a datapath,
// a policy and pods exposes with promtool's linter (names with units,
// counters ending in _total, …) and that the operability series exist.
func TestMetricsPassPromtoolLint(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		privileged.Needs(t, "promtool missing (Debian package prometheus; hack/deps.sh installs it)")
	}
	n, _ := newPolicyNode(t, harness.NodeOptions{PodCIDRs: []string{"10.96.0.0/24", "fd96::/64"}}, map[string]string{"db.yaml": dbAllowWeb})
	addPod(t, newCNI(t, n, labelledConflist(t, n, map[string]string{"role": "db"})), "db")
	if _, err := newCNI(t, n, []byte(`{"cniVersion":"1.1.0","name":"x","plugins":[{"type":"coordino","runDir":"`+n.RunDir+`","mtu":1}]}`)).Add(ctx(t), harness.RuntimeConf(newPod(t, "bad"), "eth0")); err == nil {
		t.Fatal("ADD with mtu 1 succeeded")
	}
	code, body, err := n.HTTPGet("/metrics")
	if err != nil || code != 200 {
		t.Fatalf("/metrics: %d %v", code, err)
	}
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = strings.NewReader(body)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("promtool check metrics: %v\n%s", err, out)
	}
	for _, want := range []string{
		`coordino_cni_request_duration_seconds_count{code="0",verb="ADD"} 1`,
		`coordino_cni_request_duration_seconds_count{code="7",verb="ADD"} 1`,
		`coordino_cni_errors_total{code="7",verb="ADD"} 1`,
		`coordino_ipam_blocks{family="ipv4"} 1`,
		`coordino_ipam_blocks{family="ipv6"} 1`,
		`coordino_ipam_addresses{block="10.96.0.0/24",family="ipv4",state="used"} 1`,
		`coordino_delete_queue_depth 0`,
		`coordino_delete_queue_oldest_age_seconds 0`,
		`coordino_bpf_map_entries{map="cdo_endpoints"} 1`,
		`coordino_bpf_map_capacity{map="cdo_policy"} 1.048576e+06`,
		`coordino_bpf_map_update_failures_total{map="cdo_ipcache",reason="full"} 0`,
		`coordino_datapath_packets_total{direction="ingress",reason="policy-denied",verdict="dropped"}`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	// Every metric the dashboard and the alerts query is one the daemon exposes.
	for _, f := range []string{"prometheusrule.yaml", "coordino-dashboard.json"} {
		data, err := os.ReadFile(filepath.Join(harness.RepoRoot(), "install", "kubernetes", "overlays", "monitoring", f))
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range regexp.MustCompile(`coordino_[a-z_]+`).FindAllString(string(data), -1) {
			base := regexp.MustCompile(`_(bucket|count|sum)$`).ReplaceAllString(name, "")
			if !strings.Contains(body, "# TYPE "+name+" ") && !strings.Contains(body, "# TYPE "+base+" histogram") {
				t.Errorf("%s queries %s, which the daemon does not expose", f, name)
			}
		}
	}
}
