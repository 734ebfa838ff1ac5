package inspectv1

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	flowv1 "github.com/coordino/coordino/proto/flow/v1"
)

func TestJSONNumbersZeroesAndIndentation(t *testing.T) {
	st := &Status{
		NodeName: "n1", Verdict: "ok",
		Maps:   []*MapPressure{{Name: "cdo_policy", Entries: 3, Capacity: 1 << 20}},
		Blocks: []*Block{},
		CrossNode: &CrossNode{Routing: "vxlan", Encryption: "none",
			Peers: []*Peer{{Name: "n2", LastHandshakeUnix: 1733000000, RxBytes: 1 << 40}}},
		KernelFeatures: []*KernelFeature{{Name: "tcx", Available: true, Detail: "6.18"}},
	}
	b, err := JSON(st, "  ")
	if err != nil {
		t.Fatal(err)
	}
	out := string(b)
	for _, want := range []string{
		"{\n  \"version\": \"\",\n  \"nodeName\": \"n1\",",
		"\n  \"maps\": [\n    {\n      \"name\": \"cdo_policy\",\n      \"entries\": 3,\n      \"capacity\": 1048576,\n      \"updateFailures\": 0,\n      \"refusing\": false\n    }\n  ],",
		"\"blocks\": [],", "\"problems\": [],", "\"deleteQueue\": 0,", "\"rxBytes\": 1099511627776,", "\"lastHandshakeUnix\": 1733000000,",
		"\"kernelFeatures\": [\n    {\n      \"name\": \"tcx\",\n      \"available\": true,",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("JSON lacks %q:\n%s", want, out)
		}
	}
	again, _ := JSON(st, "  ")
	if string(again) != out {
		t.Errorf("JSON is not stable")
	}
	var back Status
	if err := protojson.Unmarshal(b, &back); err != nil || !proto.Equal(&back, st) {
		t.Fatalf("protojson does not read it back: %v\n%v", err, &back)
	}
}

func TestJSONOneLineKeepsNanosecondsExact(t *testing.T) {
	ev := &flowv1.FlowEvent{TimeUnixNano: 1733000000123456789, Src: "10.0.0.1", Reason: "policy-denied", Endpoint: "a<b>&c"}
	b, err := JSON(ev, "")
	if err != nil {
		t.Fatal(err)
	}
	out := string(b)
	if !strings.HasPrefix(out, `{"timeUnixNano":1733000000123456789,"endpoint":"a<b>&c",`) || strings.Count(out, "\n") != 1 || strings.Contains(out, " ") {
		t.Fatalf("one-line JSON = %s", out)
	}
	var back flowv1.FlowEvent
	if err := protojson.Unmarshal(b, &back); err != nil || !proto.Equal(&back, ev) {
		t.Fatalf("read back: %v %v", err, &back)
	}
}
