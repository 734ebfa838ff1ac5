package wire

import (
	"bytes"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	cniv1 "github.com/coordino/coordino/proto/cni/v1"
)

var sample = &Request{
	ContainerID: "c1", Netns: "/var/run/netns/x", IfName: "eth0",
	Args: "K8S_POD_NAME=p", Path: "/opt/cni/bin", Stdin: []byte(`{"cniVersion":"1.1.0"}`),
}

func TestRequestMatchesGeneratedCode(t *testing.T) {
	var got cniv1.CNIRequest
	if err := proto.Unmarshal(AppendRequest(nil, sample), &got); err != nil {
		t.Fatal(err)
	}
	want := &cniv1.CNIRequest{ContainerId: "c1", Netns: "/var/run/netns/x", Ifname: "eth0", Args: "K8S_POD_NAME=p", Path: "/opt/cni/bin", Stdin: sample.Stdin}
	if !proto.Equal(&got, want) {
		t.Fatalf("generated code decodes %v, want %v", &got, want)
	}
	data, _ := proto.Marshal(want)
	back, err := DecodeRequest(data)
	if err != nil || back.ContainerID != "c1" || back.Path != "/opt/cni/bin" || !bytes.Equal(back.Stdin, sample.Stdin) {
		t.Fatalf("DecodeRequest = %+v, %v", back, err)
	}
}

func TestQueuedDeleteMatchesGeneratedCode(t *testing.T) {
	var got cniv1.QueuedDelete
	if err := proto.Unmarshal(AppendQueuedDelete(nil, sample, 1234567890123), &got); err != nil {
		t.Fatal(err)
	}
	if got.QueuedUnixNano != 1234567890123 || got.Request.GetIfname() != "eth0" {
		t.Fatalf("generated code decodes %v", &got)
	}
	data, _ := proto.Marshal(&got)
	req, at, err := DecodeQueuedDelete(data)
	if err != nil || at != 1234567890123 || req.Netns != sample.Netns {
		t.Fatalf("DecodeQueuedDelete = %+v %d %v", req, at, err)
	}
}

func TestResponseAndStatusFromGeneratedCode(t *testing.T) {
	data, _ := proto.Marshal(&cniv1.CNIResponse{Result: []byte(`{"ips":[]}`)})
	if res, err := DecodeResponse(data); err != nil || string(res) != `{"ips":[]}` {
		t.Fatalf("DecodeResponse = %q, %v", res, err)
	}
	other, _ := anypb.New(&cniv1.CNIResponse{})
	detail, _ := anypb.New(&cniv1.CNIError{Code: 7, Msg: "mtu 70000 out of range", Details: "d"})
	if detail.TypeUrl != TypeURLCNIError {
		t.Fatalf("type URL %q", detail.TypeUrl)
	}
	data, _ = proto.Marshal(&status.Status{Code: 9, Message: "m", Details: []*anypb.Any{other, detail}})
	st, err := DecodeStatus(data)
	if err != nil || st.Code != 9 || st.Message != "m" || st.CNIError == nil || *st.CNIError != (CNIError{7, "mtu 70000 out of range", "d"}) {
		t.Fatalf("DecodeStatus = %+v %+v, %v", st, st.CNIError, err)
	}
}

func FuzzDecodeStatus(f *testing.F) {
	detail, _ := anypb.New(&cniv1.CNIError{Code: 7, Msg: "bad"})
	seed, _ := proto.Marshal(&status.Status{Code: 9, Message: "m", Details: []*anypb.Any{detail}})
	f.Add(seed)
	f.Add([]byte{0x08, 0xff})
	f.Fuzz(func(t *testing.T, data []byte) {
		st, err := DecodeStatus(data)
		if err != nil {
			return
		}
		var ref status.Status
		if proto.Unmarshal(data, &ref) == nil && (ref.Code != st.Code || ref.Message != st.Message) {
			t.Fatalf("decoded %+v, generated code %v", st, &ref)
		}
	})
}

func FuzzDecodeQueuedDelete(f *testing.F) {
	f.Add(AppendQueuedDelete(nil, sample, 42))
	f.Add([]byte{0x0a, 0x80})
	f.Fuzz(func(t *testing.T, data []byte) {
		req, at, err := DecodeQueuedDelete(data)
		if err != nil || req == nil {
			return
		}
		again, at2, err := DecodeQueuedDelete(AppendQueuedDelete(nil, req, at))
		if err != nil || at2 != at || again.ContainerID != req.ContainerID || again.Netns != req.Netns || again.IfName != req.IfName || again.Args != req.Args || again.Path != req.Path || !bytes.Equal(again.Stdin, req.Stdin) {
			t.Fatalf("round trip: %+v %d → %+v %d %v", req, at, again, at2, err)
		}
	})
}
