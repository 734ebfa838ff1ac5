package request

import (
	"errors"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	cniv1 "github.com/coordino/coordino/proto/cni/v1"
)

const goodConf = `{"cniVersion":"1.1.0","name":"net1","type":"coordino","args":{"cni":{"labels":[{"key":"app","value":"web"}]}}}`

func code(err error) uint {
	var e *types.Error
	if errors.As(err, &e) {
		return e.Code
	}
	return 0
}

func TestParseErrors(t *testing.T) {
	cases := []struct {
		name     string
		verb     Verb
		req      *cniv1.CNIRequest
		wantCode uint
		wantMsg  string
	}{
		{"bad json", Add, &cniv1.CNIRequest{Stdin: []byte("{")}, types.ErrDecodingFailure, "decode network config"},
		{"no name", Add, &cniv1.CNIRequest{Stdin: []byte(`{"cniVersion":"1.0.0","type":"coordino"}`)}, types.ErrInvalidNetworkConfig, "name"},
		{"wrong type", Add, &cniv1.CNIRequest{Stdin: []byte(`{"cniVersion":"1.0.0","name":"n","type":"bridge"}`)}, types.ErrInvalidNetworkConfig, "type"},
		{"old version", Add, &cniv1.CNIRequest{Stdin: []byte(`{"cniVersion":"0.2.0","name":"n","type":"coordino"}`)}, types.ErrIncompatibleCNIVersion, "cniVersion"},
		{"bad mtu", Add, &cniv1.CNIRequest{Stdin: []byte(`{"cniVersion":"1.0.0","name":"n","type":"coordino","mtu":10}`)}, types.ErrInvalidNetworkConfig, "mtu"},
		{"bad container id", Add, &cniv1.CNIRequest{Stdin: []byte(goodConf), ContainerId: "-x y", Ifname: "eth0", Netns: "/x"}, types.ErrInvalidEnvironmentVariables, "containerID"},
		{"long ifname", Add, &cniv1.CNIRequest{Stdin: []byte(goodConf), ContainerId: "c1", Ifname: "abcdefghijklmnopq", Netns: "/x"}, types.ErrInvalidEnvironmentVariables, "interface name"},
		{"no netns on add", Add, &cniv1.CNIRequest{Stdin: []byte(goodConf), ContainerId: "c1", Ifname: "eth0"}, types.ErrInvalidEnvironmentVariables, "CNI_NETNS"},
		{"no netns on check", Check, &cniv1.CNIRequest{Stdin: []byte(goodConf), ContainerId: "c1", Ifname: "eth0"}, types.ErrInvalidEnvironmentVariables, "CNI_NETNS"},
		{"bad args", Add, &cniv1.CNIRequest{Stdin: []byte(goodConf), ContainerId: "c1", Ifname: "eth0", Netns: "/x", Args: "IgnoreUnknown"}, types.ErrInvalidEnvironmentVariables, "CNI_ARGS"},
		{"bad prevResult", Add, &cniv1.CNIRequest{Stdin: []byte(`{"cniVersion":"1.0.0","name":"n","type":"coordino","prevResult":{"ips":"x"}}`), ContainerId: "c1", Ifname: "eth0", Netns: "/x"}, types.ErrDecodingFailure, "prevResult"},
		{"label key with =", Add, labelled(`{"key":"a=b","value":"c"}`), types.ErrInvalidNetworkConfig, "args.cni.labels[0].key"},
		{"label value with =", Add, labelled(`{"key":"a","value":"b=c"}`), types.ErrInvalidNetworkConfig, "args.cni.labels[0].value"},
		{"empty label key", Add, labelled(`{"key":"","value":"c"}`), types.ErrInvalidNetworkConfig, "args.cni.labels[0].key"},
		{"label key too long", Check, labelled(`{"key":"` + strings.Repeat("k", 64) + `","value":"c"}`), types.ErrInvalidNetworkConfig, "args.cni.labels[0].key"},
		{"label value with space", Add, labelled(`{"key":"app","value":"a b"}`), types.ErrInvalidNetworkConfig, "args.cni.labels[0].value"},
		{"duplicate label key", Add, labelled(`{"key":"app","value":"a"},{"key":"app","value":"b"}`), types.ErrInvalidNetworkConfig, "args.cni.labels[1].key"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse(c.verb, c.req)
			if code(err) != c.wantCode || !strings.Contains(err.Error(), c.wantMsg) {
				t.Fatalf("err = %v (code %d), want code %d mentioning %q", err, code(err), c.wantCode, c.wantMsg)
			}
		})
	}
}

// labelled is an ADD request whose config carries the given args.cni.labels entries.
func labelled(entries string) *cniv1.CNIRequest {
	return &cniv1.CNIRequest{Stdin: []byte(`{"cniVersion":"1.1.0","name":"n","type":"coordino","args":{"cni":{"labels":[` + entries + `]}}}`),
		ContainerId: "c1", Ifname: "eth0", Netns: "/x"}
}

// TestLabelsAreKubernetesLabels: label sets that differ must stay different,
// and a config with bad labels can still be torn down.
func TestLabelsAreKubernetesLabels(t *testing.T) {
	inv, err := Parse(Add, labelled(`{"key":"example.com/tier","value":"web-1.a_b"},{"key":"empty","value":""}`))
	if err != nil || inv.Labels["example.com/tier"] != "web-1.a_b" || len(inv.Labels) != 2 {
		t.Fatalf("valid labels: %v %v", inv, err)
	}
	if _, err := Parse(Del, labelled(`{"key":"a=b","value":"c"}`)); err != nil {
		t.Fatalf("DEL refused because of labels: %v", err)
	}
}

func TestParseGood(t *testing.T) {
	inv, err := Parse(Add, &cniv1.CNIRequest{Stdin: []byte(goodConf), ContainerId: "c1", Ifname: "eth0", Netns: "/x",
		Args: "IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME=web-1;K8S_POD_UID=u1"})
	if err != nil {
		t.Fatal(err)
	}
	if inv.Key.String() != "net1/c1/eth0" || inv.PodNamespace != "shop" || inv.PodName != "web-1" || inv.PodUID != "u1" || inv.Labels["app"] != "web" {
		t.Fatalf("inv = %+v", inv)
	}
	// DEL needs no netns; GC and STATUS need no container.
	if _, err := Parse(Del, &cniv1.CNIRequest{Stdin: []byte(goodConf), ContainerId: "c1", Ifname: "eth0"}); err != nil {
		t.Fatal(err)
	}
	if inv, err := Parse(GC, &cniv1.CNIRequest{Stdin: []byte(goodConf)}); err != nil || inv.Key.Network != "net1" {
		t.Fatal(err)
	}
	inv, _ = Parse(Del, &cniv1.CNIRequest{Stdin: []byte(goodConf), ContainerId: "c1", Ifname: "eth0"})
	if inv.PodNamespace != "default" {
		t.Fatalf("namespace default = %q", inv.PodNamespace)
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(goodConf), "c1", "eth0", "/x", "K8S_POD_NAMESPACE=a")
	f.Add([]byte(`{"cniVersion":"0.4.0","name":"n","type":"coordino","prevResult":{"cniVersion":"0.4.0","ips":[{"version":"4","address":"10.0.0.2/24"}]}}`), "c", "eth0", "/x", "")
	f.Add([]byte(`{"cniVersion":"1.1.0","name":"n","type":"coordino","args":{"cni":{"labels":[{"key":"a=b","value":"c"},{"key":"a","value":"b=c"}]}}}`), "c", "eth0", "/x", "")
	f.Fuzz(func(t *testing.T, stdin []byte, cid, ifname, netns, args string) {
		for _, v := range []Verb{Add, Del, Check, GC, Status} {
			inv, err := Parse(v, &cniv1.CNIRequest{Stdin: stdin, ContainerId: cid, Ifname: ifname, Netns: netns, Args: args})
			if err != nil {
				if code(err) == 0 {
					t.Fatalf("error without a CNI code: %v", err)
				}
				continue
			}
			if inv.Conf == nil {
				t.Fatal("nil conf without error")
			}
		}
	})
}

// BenchmarkParseChainedAdd parses a chained ADD as bridge+host-local's
// result reaches Coordino through libcni.
func BenchmarkParseChainedAdd(b *testing.B) {
	req := &cniv1.CNIRequest{ContainerId: "c1", Ifname: "eth0", Netns: "/var/run/netns/x",
		Args: "K8S_POD_NAMESPACE=default;K8S_POD_NAME=p",
		Stdin: []byte(`{"cniVersion":"1.1.0","name":"n","type":"coordino","runDir":"/run/coordino",` +
			`"prevResult":{"cniVersion":"1.1.0","interfaces":[{"name":"cbr0","mac":"aa:bb:cc:dd:ee:01"},` +
			`{"name":"veth1234abcd","mac":"aa:bb:cc:dd:ee:02"},{"name":"eth0","mac":"aa:bb:cc:dd:ee:03","sandbox":"/var/run/netns/x"}],` +
			`"ips":[{"interface":2,"address":"10.92.0.5/16","gateway":"10.92.0.1"}],` +
			`"routes":[{"dst":"0.0.0.0/0","gw":"10.92.0.1"}],"dns":{}}}`)}
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if _, err := Parse(Add, req); err != nil {
			b.Fatal(err)
		}
	}
}
