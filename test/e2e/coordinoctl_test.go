package e2e

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"maps"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/yaml"

	cniv1 "github.com/coordino/coordino/proto/cni/v1"
	flowv1 "github.com/coordino/coordino/proto/flow/v1"
	inspectv1 "github.com/coordino/coordino/proto/inspect/v1"
	"github.com/coordino/coordino/test/harness"
)

const dbAllowWeb = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: db-allow-web, namespace: default}
spec:
  podSelector: {matchLabels: {role: db}}
  policyTypes: [Ingress]
  ingress:
  - from: [{podSelector: {matchLabels: {role: web}}}]
    ports: [{protocol: TCP, port: 5432}]
`

// otherEgress lets "other" reach the pod CIDR except web's address.
const otherEgress = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: other-egress, namespace: default}
spec:
  podSelector: {matchLabels: {role: other}}
  policyTypes: [Egress]
  egress:
  - to: [{ipBlock: {cidr: 10.94.0.0/24, except: [%s/32]}}]
`

// ctlPod is a pod of the coordinoctl test.
type ctlPod struct {
	*harness.Pod
	addr netip.Addr
}

// coordinoctl runs bin/coordinoctl against the node's inspection socket.
func coordinoctl(t *testing.T, n *harness.Node, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(filepath.Join(harness.BinDir(), "coordinoctl"), append(args, "--socket", filepath.Join(n.RunDir, "inspect.sock"))...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("coordinoctl %s: %w: %s", strings.Join(args, " "), err, stderr.String())
	}
	return string(out), nil
}

// ctlJSON runs a command with -o json and decodes its output strictly.
func ctlJSON(t *testing.T, n *harness.Node, m proto.Message, args ...string) {
	t.Helper()
	out, err := coordinoctl(t, n, append(args, "-o", "json")...)
	if err != nil {
		t.Fatal(err)
	}
	if err := protojson.Unmarshal([]byte(out), m); err != nil {
		t.Fatalf("coordinoctl %v: output is not a %T: %v\n%s", args, m, err, out)
	}
}

func TestCoordinoctlAgainstLiveDaemon(t *testing.T) {
	if _, err := os.Stat(filepath.Join(harness.BinDir(), "coordinoctl")); err != nil {
		t.Fatalf("bin/coordinoctl missing: run make build first")
	}
	dir := t.TempDir()
	n, policyDir := newPolicyNode(t, harness.NodeOptions{PodCIDRs: []string{"10.94.0.0/24"}}, map[string]string{"db.yaml": dbAllowWeb})
	pods := map[string]ctlPod{}
	for _, role := range []string{"db", "web", "other"} {
		p, _, addrs := addPod(t, newCNI(t, n, labelledConflist(t, n, map[string]string{"role": role})), role)
		pods[role] = ctlPod{p, addrs[0]}
	}
	if err := n.WritePolicy(policyDir, "other.yaml", []byte(fmt.Sprintf(otherEgress, pods["web"].addr)), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	for role, port := range map[string]int{"db": 5432, "web": 8080} {
		stop, err := harness.Serve(pods[role].NS, pods[role].addr, port, role)
		if err != nil {
			t.Fatal(err)
		}
		defer stop()
	}

	t.Run("status", func(t *testing.T) {
		var st inspectv1.Status
		ctlJSON(t, n, &st, "status")
		if st.Verdict != "ok" || st.Mode != "standalone" || st.NodeName != n.Name || st.AttachMode != "tc" ||
			st.PrimaryEndpoints != 3 || st.ChainedEndpoints != 0 || st.Identities != 3 || st.PolicyRevision == 0 || st.DeleteQueue != 0 {
			t.Fatalf("status = %v", &st)
		}
		if len(st.Blocks) != 1 || st.Blocks[0].Cidr != "10.94.0.0/24" || st.Blocks[0].Used != 3 || st.Blocks[0].Free != st.Blocks[0].Size-3 {
			t.Fatalf("blocks = %v", st.Blocks)
		}
		if m := st.Masquerade; !m.GetEnabled() || !slices.Contains(m.GetSources(), "10.94.0.0/24") || m.GetProblem() != "" {
			t.Fatalf("masquerade = %v, want on for the node's pod CIDR", m)
		}
		maps := map[string]*inspectv1.MapPressure{}
		for _, m := range st.Maps {
			maps[m.Name] = m
		}
		if m := maps["cdo_endpoints"]; m == nil || m.Entries != 3 || m.Capacity != 65536 {
			t.Fatalf("endpoints map pressure = %v", m)
		}
		if m := maps["cdo_policy"]; m == nil || m.Entries == 0 || m.Capacity != 1<<20 {
			t.Fatalf("policy map pressure = %v", m)
		}
		for _, name := range []string{"cdo_ipcache", "cdo_conntrack"} {
			if maps[name] == nil || maps[name].Capacity == 0 {
				t.Fatalf("no pressure for %s: %v", name, st.Maps)
			}
		}
		if st.CrossNode.GetEncryption() != "none" || st.CrossNode.GetRouting() == "" || len(st.CrossNode.GetPeers()) != 0 {
			t.Fatalf("cross-node = %v", st.CrossNode)
		}
		table, err := coordinoctl(t, n, "status")
		if err != nil || !regexp.MustCompile(`(?m)^Verdict:\s+OK$`).MatchString(table) ||
			!regexp.MustCompile(`(?m)^Cross-node:\s+routing `+st.CrossNode.Routing+`, encryption none$`).MatchString(table) {
			t.Fatalf("status table lacks the verdict or cross-node line: %v\n%s", err, table)
		}
		// Global flags may come first.
		if out, err := exec.Command(filepath.Join(harness.BinDir(), "coordinoctl"), "--socket", filepath.Join(n.RunDir, "inspect.sock"), "-o", "json", "status").Output(); err != nil ||
			!strings.Contains(string(out), `"deleteQueue": 0,`) {
			t.Fatalf("coordinoctl --socket S -o json status: %v\n%s", err, out)
		}
		y, err := coordinoctl(t, n, "status", "-o", "yaml")
		if err != nil {
			t.Fatal(err)
		}
		j, err := yaml.YAMLToJSON([]byte(y))
		var fromYAML inspectv1.Status
		if err != nil || protojson.Unmarshal(j, &fromYAML) != nil || fromYAML.NodeName != n.Name {
			t.Fatalf("status -o yaml: %v\n%s", err, y)
		}
	})

	t.Run("endpoints", func(t *testing.T) {
		var resp inspectv1.ListEndpointsResponse
		ctlJSON(t, n, &resp, "endpoints")
		if len(resp.Endpoints) != 3 {
			t.Fatalf("endpoints = %v", resp.Endpoints)
		}
		for _, e := range resp.Endpoints {
			p := pods[e.PodName]
			if p.Pod == nil || e.ContainerId != p.ContainerID || !slices.Equal(e.Ips, []string{p.addr.String()}) || e.Mode != "primary" ||
				e.HostIfindex == 0 || e.Identity < 256 || e.Labels["role"] != e.PodName || e.AttachMode != "tc" {
				t.Fatalf("endpoint %v does not match pod %s (%v)", e, e.PodName, p.addr)
			}
			if e.IngressIsolated != (e.PodName == "db") || e.EgressIsolated != (e.PodName == "other") {
				t.Fatalf("endpoint %s isolation in=%t eg=%t", e.PodName, e.IngressIsolated, e.EgressIsolated)
			}
		}
		for _, q := range []string{"db", "default/db", pods["db"].ContainerID, pods["db"].ContainerID[:10]} {
			var e inspectv1.Endpoint
			ctlJSON(t, n, &e, "endpoint", "get", q)
			if e.ContainerId != pods["db"].ContainerID {
				t.Fatalf("endpoint get %s = %v", q, &e)
			}
		}
		if out, err := coordinoctl(t, n, "endpoint", "get", "nosuchpod"); err == nil || !strings.Contains(err.Error(), "no endpoint matches") {
			t.Fatalf("endpoint get of an unknown pod: %v %s", err, out)
		}
	})

	t.Run("identities and ipam", func(t *testing.T) {
		var ids inspectv1.ListIdentitiesResponse
		ctlJSON(t, n, &ids, "identities")
		roles := map[string]bool{}
		for _, id := range ids.Identities {
			if id.Namespace != "default" || id.Endpoints != 1 || id.Id < 256 {
				t.Fatalf("identity %v", id)
			}
			roles[id.Labels["role"]] = true
		}
		if len(ids.Identities) != 3 || !roles["db"] || !roles["web"] || !roles["other"] {
			t.Fatalf("identities = %v", ids.Identities)
		}
		var ipam inspectv1.IPAM
		ctlJSON(t, n, &ipam, "ipam")
		got := map[string]string{}
		for _, a := range ipam.Allocations {
			got[a.Ip] = a.Pod
		}
		for role, p := range pods {
			if got[p.addr.String()] != "default/"+role {
				t.Fatalf("ipam allocations %v lack %s of %s", got, p.addr, role)
			}
		}
	})

	// policy explain must agree with what the datapath does to real traffic.
	t.Run("policy explain agrees with traffic", func(t *testing.T) {
		for _, c := range []struct {
			from, to   string
			fromNS     *harness.Pod
			port       int
			allowed    bool
			rule       string // a rule naming the allowance, or the policy denying
			denyingDir string
		}{
			{from: "web", to: "db", port: 5432, allowed: true, rule: "default/db-allow-web spec.ingress[0]"},
			{from: "other", to: "db", port: 5432, rule: "default/db-allow-web", denyingDir: "ingress"},
			{from: "other", to: "web", port: 8080, rule: "default/other-egress", denyingDir: "egress"},
			{from: "db", to: "web", port: 8080, allowed: true},
			{from: n.NodeIP.String(), to: "db", port: 5432, allowed: true},
		} {
			name := fmt.Sprintf("%s->%s:%d", c.from, c.to, c.port)
			var ex inspectv1.PolicyExplanation
			ctlJSON(t, n, &ex, "policy", "explain", "--from", c.from, "--to", c.to, "--port", fmt.Sprintf("%d/TCP", c.port))
			src := n.NS
			if p := pods[c.from]; p.Pod != nil {
				src = p.NS
			}
			_, dialErr := harness.Dial(src, pods[c.to].addr, c.port)
			if (dialErr == nil) != c.allowed {
				t.Fatalf("%s: traffic allowed=%t (%v), test expects %t", name, dialErr == nil, dialErr, c.allowed)
			}
			if (ex.Verdict == "allowed") != c.allowed {
				t.Fatalf("%s: explain says %q but traffic allowed=%t: %v", name, ex.Verdict, dialErr == nil, &ex)
			}
			if c.allowed && c.rule != "" && !slices.Contains(ex.Steps[1].AllowedBy, c.rule) {
				t.Fatalf("%s: allowance not attributed to %s: %v", name, c.rule, &ex)
			}
			if !c.allowed {
				step := ex.Steps[0]
				if c.denyingDir == "ingress" {
					step = ex.Steps[1]
				}
				if step.Verdict != "denied" || step.Reason != "policy-denied" || !slices.Contains(step.SelectedBy, c.rule) || !strings.Contains(ex.Summary, c.rule) {
					t.Fatalf("%s: denial not explained by %s at %s: %v", name, c.rule, c.denyingDir, &ex)
				}
			}
		}
		// The CIDR rule allowing other's egress to db is named.
		var ex inspectv1.PolicyExplanation
		ctlJSON(t, n, &ex, "policy", "explain", "--from", "other", "--to", "db", "--port", "5432/tcp")
		if !slices.Contains(ex.Steps[0].AllowedBy, "default/other-egress spec.egress[0]") {
			t.Fatalf("egress allowance by ipBlock not named: %v", &ex)
		}
		table, err := coordinoctl(t, n, "policy", "explain", "--from", "other", "--to", "db", "--port", "5432/TCP")
		if err != nil || !strings.Contains(table, "default deny of default/db-allow-web") || !regexp.MustCompile(`(?m)^Verdict:\s+DENIED$`).MatchString(table) {
			t.Fatalf("explain table: %v\n%s", err, table)
		}
		// The peer's identity is said in words: at db's ingress, other's pods;
		// at other's egress, db's pods; both addresses are in other-egress's ipBlock.
		for _, role := range []string{"other", "db"} {
			want := `(?m)^  peer:\s+identity \d+: pods in namespace default with labels role=` + role + `; its address is in ipBlock 10\.94\.0\.0/24 \(cidr:\d+\)$`
			if !regexp.MustCompile(want).MatchString(table) {
				t.Fatalf("explain table lacks %s:\n%s", want, table)
			}
		}
	})

	t.Run("flows follow sees a denied connection within 1s", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, filepath.Join(harness.BinDir(), "coordinoctl"), "flows", "--follow", "--verdict", "dropped",
			"--pod", "default/db", "--protocol", "TCP", "-o", "json", "--socket", filepath.Join(n.RunDir, "inspect.sock"))
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { cancel(); _ = cmd.Wait() }()
		events := make(chan *flowv1.FlowEvent, 64)
		go func() {
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				var ev flowv1.FlowEvent
				if protojson.Unmarshal(sc.Bytes(), &ev) == nil {
					events <- &ev
				}
			}
			close(events)
		}()
		waitFor := func(port uint32, probe func()) time.Duration {
			start := time.Now()
			go probe()
			for {
				select {
				case ev, ok := <-events:
					if !ok {
						t.Fatal("coordinoctl flows exited")
					}
					if ev.DstPort == port && ev.Dst == pods["db"].addr.String() {
						if ev.Reason != "policy-denied" || ev.Verdict != "dropped" || ev.Direction != "ingress" || ev.Src != pods["other"].addr.String() {
							t.Fatalf("flow event = %v", ev)
						}
						return time.Since(start)
					}
				case <-ctx.Done():
					t.Fatalf("no drop to port %d seen", port)
				}
			}
		}
		// Warm up until the stream is surely subscribed, then time one connection.
		waitFor(5432, func() {
			for ctx.Err() == nil {
				_, _ = harness.Dial(pods["other"].NS, pods["db"].addr, 5432)
			}
		})
		took := waitFor(5433, func() { _, _ = harness.Dial(pods["other"].NS, pods["db"].addr, 5433) })
		t.Logf("denied connection shown by coordinoctl flows --follow after %v", took)
		if took > time.Second {
			t.Fatalf("drop shown after %v, want within 1s", took)
		}
		// The drops are remembered for --since.
		out, err := coordinoctl(t, n, "flows", "--since", "1m", "--port", "5433", "-o", "json")
		if err != nil || !strings.Contains(out, `"reason":"policy-denied"`) || !strings.Contains(out, pods["other"].addr.String()) {
			t.Fatalf("flows --since: %v\n%s", err, out)
		}
		// Only drops are remembered: asking for allowed ones says so.
		if out, err := coordinoctl(t, n, "flows", "--since", "1m", "--port", "5433", "--verdict", "allowed", "-o", "json"); err == nil ||
			strings.TrimSpace(out) != "" || !strings.Contains(err.Error(), "the daemon remembers dropped flows only") {
			t.Fatalf("flows --verdict allowed without --follow: %v %s", err, out)
		}
		// The table names the pod and says the time is UTC.
		table, err := coordinoctl(t, n, "flows", "--since", "1m", "--port", "5433")
		if err != nil || !regexp.MustCompile(`(?m)^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z  default/db  +ingress  dropped  policy-denied`).MatchString(table) {
			t.Fatalf("flows table: %v\n%s", err, table)
		}
	})

	t.Run("bugtool", func(t *testing.T) {
		const wgKey = "yAnz5TF+lXXJte14tji3zlMNq+hd2rYUIgJBgB3fBmk="
		const token = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW06Y29vcmRpbm8ifQ.c2lnbmF0dXJlLXZhbHVl"
		const pubKey = "xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg="
		logFile := filepath.Join(dir, "daemon.log")
		if err := os.WriteFile(logFile, []byte(`{"level":"info","msg":"wireguard up","privateKey":"`+wgKey+`","publicKey":"`+pubKey+`"}`+"\n"+
			`{"level":"debug","msg":"api","authorization":"Bearer `+token+`"}`+"\n"+n.LogTail(50)), 0o600); err != nil {
			t.Fatal(err)
		}
		tarball := filepath.Join(dir, "bug.tar.gz")
		if out, err := coordinoctl(t, n, "bugtool", "--output", tarball, "--log-file", logFile); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		files := readTarball(t, tarball)
		if !strings.Contains(files["daemon/daemon.log"], `"msg":"serving CNI"`) {
			t.Errorf("bugtool lacks the daemon's own log")
		}
		for _, want := range []string{"daemon/status.json", "daemon/config.json", "daemon/store/endpoints.json", "daemon/bpf/maps.json",
			"daemon/net/links.txt", "daemon/net/routes.txt", "daemon/net/filters.txt", "versions.txt", "logs/0-daemon.log"} {
			if _, ok := files[want]; !ok {
				t.Errorf("bugtool tarball lacks %s (has %v)", want, slices.Sorted(maps.Keys(files)))
			}
		}
		if !strings.Contains(files["daemon/store/endpoints.json"], pods["db"].ContainerID) ||
			!strings.Contains(files["daemon/net/routes.txt"], pods["db"].addr.String()) ||
			!strings.Contains(files["daemon/net/filters.txt"], "cdo_") ||
			!strings.Contains(files["daemon/bpf/maps.json"], pods["db"].addr.String()) {
			t.Errorf("bugtool content does not reflect the node's state")
		}
		if !strings.Contains(files["logs/0-daemon.log"], "wireguard up") {
			t.Errorf("log not included")
		}
		if !strings.Contains(files["logs/0-daemon.log"], `"publicKey":"`+pubKey+`"`) {
			t.Errorf("the public key was redacted:\n%s", files["logs/0-daemon.log"])
		}
		if !strings.Contains(files["daemon/status.json"], `"deleteQueue": 0,`) || !strings.Contains(files["daemon/status.json"], `"crossNode": {`) {
			t.Errorf("status.json is not status -o json:\n%s", files["daemon/status.json"])
		}
		for name, content := range files {
			for _, secret := range []string{wgKey, token, "eyJhbGciOiJSUzI1NiJ9"} {
				if strings.Contains(content, secret) {
					t.Errorf("bugtool file %s contains a secret", name)
				}
			}
		}
	})

	t.Run("read-only service refuses writes and non-root peers", func(t *testing.T) {
		sock := filepath.Join(n.RunDir, "inspect.sock")
		conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		c, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err = cniv1.NewCNIClient(conn).Add(c, &cniv1.CNIRequest{ContainerId: "x"})
		if status.Code(err) != codes.Unimplemented {
			t.Fatalf("CNI ADD on the inspection socket: %v, want Unimplemented", err)
		}
		// Open the path to everyone so that only the peer check stands in the way.
		for _, p := range []string{filepath.Dir(n.Dir), n.Dir, n.RunDir} {
			fi, err := os.Stat(p)
			if err != nil {
				t.Fatal(err)
			}
			os.Chmod(p, 0o755)
			defer os.Chmod(p, fi.Mode().Perm())
		}
		os.Chmod(sock, 0o666)
		defer os.Chmod(sock, 0o600)
		binDir, err := os.MkdirTemp("", "coordinoctl-")
		if err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(binDir)
		os.Chmod(binDir, 0o755)
		data, err := os.ReadFile(filepath.Join(harness.BinDir(), "coordinoctl"))
		if err != nil {
			t.Fatal(err)
		}
		bin := filepath.Join(binDir, "coordinoctl")
		if err := os.WriteFile(bin, data, 0o755); err != nil {
			t.Fatal(err)
		}
		run := func(cred *syscall.Credential) (string, error) {
			cmd := exec.Command(bin, "status", "--timeout", "3s", "--socket", sock)
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
			out, err := cmd.CombinedOutput()
			return string(out), err
		}
		if out, err := run(nil); err != nil || !strings.Contains(out, "Verdict:") {
			t.Fatalf("root: %v %s", err, out)
		}
		// Refused by the peer check (not by the socket's mode, opened above),
		// said as such, and logged by the daemon.
		if out, err := run(&syscall.Credential{Uid: 65534, Gid: 65534}); err == nil || strings.Contains(out, "Verdict:") ||
			!strings.Contains(out, "permission denied: root only: the daemon on "+sock+" closed the connection of uid 65534") {
			t.Fatalf("uid 65534: %v %s", err, out)
		}
		deadline := time.Now().Add(5 * time.Second)
		for !n.LogContains(`"uid":65534`) {
			if time.Now().After(deadline) {
				t.Fatalf("the daemon did not log the refusal:\n%s", n.LogTail(20))
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
}

func readTarball(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(gz)
	files := map[string]string{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		_, rel, _ := strings.Cut(h.Name, "/")
		files[rel] = string(b)
	}
}

// Without the datapath the verdict says policy is not enforced, and policy
// explain refuses rather than explain a model the node does not enforce.
func TestCoordinoctlWithoutDatapath(t *testing.T) {
	n := newNode(t, harness.NodeOptions{PodCIDRs: []string{"10.98.0.0/30"}, ExtraArgs: []string{"--no-datapath"}})
	c := newCNI(t, n, n.PrimaryConflist("coordino", "1.1.0"))
	addPod(t, c, "a")
	addPod(t, c, "b")
	var st inspectv1.Status
	ctlJSON(t, n, &st, "status")
	// A /30 has two pod addresses: both in use is an exhausted block.
	if st.Verdict != "failing" || st.AttachMode != "none" || len(st.Maps) != 0 || st.PrimaryEndpoints != 2 ||
		!slices.ContainsFunc(st.Problems, func(p string) bool { return strings.Contains(p, "exhausted") }) ||
		!slices.ContainsFunc(st.Problems, func(p string) bool { return strings.Contains(p, "NetworkPolicy is not enforced") }) {
		t.Fatalf("status = %v", &st)
	}
	if out, err := coordinoctl(t, n, "policy", "explain", "--from", "a", "--to", "b", "--port", "80/TCP"); err == nil || !strings.Contains(err.Error(), "datapath is disabled") {
		t.Fatalf("explain without datapath: %v %s", err, out)
	}
}
