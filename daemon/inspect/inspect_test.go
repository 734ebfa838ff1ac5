package inspect

import (
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/coordino/coordino/daemon/datapath"
	inspectv1 "github.com/coordino/coordino/proto/inspect/v1"
)

func TestFindEndpoint(t *testing.T) {
	eps := []*inspectv1.Endpoint{
		{Key: "n/c0ffee11/eth0", ContainerId: "c0ffee11", PodNamespace: "default", PodName: "web"},
		{Key: "n/c0ffee22/eth0", ContainerId: "c0ffee22", PodNamespace: "prod", PodName: "web"},
		{Key: "n/deadbeef/eth0", ContainerId: "deadbeef", PodNamespace: "default", PodName: "db"},
	}
	for q, want := range map[string]string{
		"db": "deadbeef", "default/web": "c0ffee11", "prod/web": "c0ffee22", "c0ffee22": "c0ffee22",
		"dead": "deadbeef", "n/c0ffee11/eth0": "c0ffee11",
	} {
		e, err := findEndpoint(eps, q)
		if err != nil || e.ContainerId != want {
			t.Errorf("findEndpoint(%q) = %v, %v; want %s", q, e, err, want)
		}
	}
	for q, code := range map[string]codes.Code{
		"web": codes.FailedPrecondition, "c0ffee": codes.FailedPrecondition, "dea": codes.NotFound,
		"nosuch": codes.NotFound, "": codes.InvalidArgument,
	} {
		if _, err := findEndpoint(eps, q); status.Code(err) != code {
			t.Errorf("findEndpoint(%q): %v, want %v", q, err, code)
		}
	}
}

func TestHistoryKeepsNewestInOrder(t *testing.T) {
	h := newHistory(4)
	t0 := time.Unix(1000, 0)
	for i := range 6 {
		h.add(datapath.Flow{Time: t0.Add(time.Duration(i) * time.Second), DstPort: uint16(i)})
	}
	got := h.since(0)
	if len(got) != 4 || got[0].DstPort != 2 || got[3].DstPort != 5 {
		t.Fatalf("history = %v", got)
	}
	if got := h.since(t0.Add(4 * time.Second).UnixNano()); len(got) != 2 || got[0].DstPort != 4 {
		t.Fatalf("since = %v", got)
	}
}
