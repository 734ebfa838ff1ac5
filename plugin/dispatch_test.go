package plugin

import (
	"bytes"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
)

func runDispatch(env map[string]string, stdin string) (*types.Error, string, string) {
	var out, errOut bytes.Buffer
	e := dispatch(func(k string) string { return env[k] }, strings.NewReader(stdin), &out, &errOut)
	return e, out.String(), errOut.String()
}

// The dispatcher answers what the CNI library's skel answered, before any
// call to the daemon: these inputs never reach one (there is none here).
func TestDispatchRefusesBeforeCallingTheDaemon(t *testing.T) {
	conf := func(version string) string {
		return `{"cniVersion":"` + version + `","name":"n","type":"coordino","runDir":"/run/coordino/dispatch-test-never-created"}`
	}
	full := map[string]string{"CNI_CONTAINERID": "c1", "CNI_NETNS": "/run/netns/x", "CNI_IFNAME": "eth0", "CNI_PATH": "/opt/cni/bin"}
	with := func(cmd string, drop ...string) map[string]string {
		env := map[string]string{"CNI_COMMAND": cmd}
		for k, v := range full {
			env[k] = v
		}
		for _, k := range drop {
			delete(env, k)
		}
		return env
	}
	cases := []struct {
		name  string
		env   map[string]string
		stdin string
		code  uint
		msg   string
	}{
		{"unknown verb", with("FROB"), conf("1.1.0"), types.ErrInvalidEnvironmentVariables, "unknown CNI_COMMAND: FROB"},
		{"ADD without netns and ifname", with("ADD", "CNI_NETNS", "CNI_IFNAME"), conf("1.1.0"), types.ErrInvalidEnvironmentVariables, "[CNI_NETNS,CNI_IFNAME] missing"},
		{"ADD without CNI_PATH", with("ADD", "CNI_PATH"), conf("1.1.0"), types.ErrInvalidEnvironmentVariables, "[CNI_PATH] missing"},
		{"CHECK without netns", with("CHECK", "CNI_NETNS"), conf("1.1.0"), types.ErrInvalidEnvironmentVariables, "CNI_NETNS"},
		{"DEL without container ID", with("DEL", "CNI_CONTAINERID"), conf("1.1.0"), types.ErrInvalidEnvironmentVariables, "CNI_CONTAINERID"},
		{"bad json", with("ADD"), `{nope`, types.ErrDecodingFailure, "decode network config"},
		{"no network name", with("ADD"), `{"cniVersion":"1.1.0","type":"coordino"}`, types.ErrInvalidNetworkConfig, "missing network name"},
		{"unsupported version", with("ADD"), conf("0.2.0"), types.ErrIncompatibleCNIVersion, "incompatible CNI versions"},
		{"CHECK before 0.4.0", with("CHECK"), conf("0.3.1"), types.ErrIncompatibleCNIVersion, "config version does not allow CHECK"},
		{"GC before 1.1.0", with("GC"), conf("1.0.0"), types.ErrIncompatibleCNIVersion, "config version does not allow GC"},
		{"STATUS before 1.1.0", with("STATUS"), conf("1.0.0"), types.ErrIncompatibleCNIVersion, "config version does not allow STATUS"},
		{"netns not UTF-8", func() map[string]string { e := with("ADD"); e["CNI_NETNS"] = "/run/netns/\xff"; return e }(), conf("1.1.0"), types.ErrInvalidEnvironmentVariables, "CNIRequest.netns: not valid UTF-8"},
		{"DEL with args not UTF-8", func() map[string]string { e := with("DEL"); e["CNI_ARGS"] = "K8S_POD_NAME=\xfe"; return e }(), conf("1.1.0"), types.ErrInvalidEnvironmentVariables, "CNIRequest.args: not valid UTF-8"},
		{"untrusted runDir", with("ADD"), `{"cniVersion":"1.1.0","name":"n","runDir":"/etc/coordino"}`, types.ErrInvalidNetworkConfig, "runDir"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e, out, _ := runDispatch(c.env, c.stdin)
			if e == nil || e.Code != c.code || !strings.Contains(e.Msg+e.Details, c.msg) {
				t.Fatalf("got %+v, want code %d mentioning %q", e, c.code, c.msg)
			}
			if out != "" {
				t.Fatalf("wrote %q to stdout besides the error", out)
			}
		})
	}
}

func TestDispatchVersionAndAbout(t *testing.T) {
	e, out, _ := runDispatch(map[string]string{"CNI_COMMAND": "VERSION"}, "")
	if e != nil {
		t.Fatal(e)
	}
	var v struct {
		CNIVersion string   `json:"cniVersion"`
		Supported  []string `json:"supportedVersions"`
	}
	if err := json.Unmarshal([]byte(out), &v); err != nil || v.CNIVersion == "" || strings.Join(v.Supported, ",") != strings.Join(SupportedVersions.SupportedVersions(), ",") {
		t.Fatalf("VERSION printed %q (%v)", out, err)
	}
	e, out, errOut := runDispatch(map[string]string{}, "")
	if e != nil || out != "" || !strings.Contains(errOut, About) || !strings.Contains(errOut, "1.1.0") {
		t.Fatalf("no CNI_COMMAND: error %v, stdout %q, stderr %q", e, out, errOut)
	}
}

// The plugin process is started for every verb of every pod: what it links
// is paid at each start (package initialisation, pages touched). These are
// the packages measured to cost it and that it does without (see
// docs/benchmarks.md, "Plugin binary and CPU").
func TestPluginLinksNothingHeavy(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/coordino/coordino/plugin/cmd/coordino").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v: %s", err, out)
	}
	heavy := []string{
		"google.golang.org/grpc",                           // grpc-go's client: plugin/unarygrpc speaks the one call instead
		"google.golang.org/protobuf/reflect/protoregistry", // descriptors registered at start: proto/cni/v1/wire encodes by hand
		"crypto/tls",
		"golang.org/x/net/http2/hpack", // tables and a Huffman tree built per exec: plugin/unarygrpc decodes from the code lengths
		"regexp",                       // compiled at start by the CNI library's validators; the daemon validates
		"github.com/containernetworking/cni/pkg/skel",
		"github.com/containernetworking/cni/pkg/ns", // enters the netns after ADD; the daemon refuses its own netns before
	}
	deps := "\n" + string(out)
	for _, h := range heavy {
		if strings.Contains(deps, "\n"+h+"\n") {
			t.Errorf("the plugin binary links %s", h)
		}
	}
}
