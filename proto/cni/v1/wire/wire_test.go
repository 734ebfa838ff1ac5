package wire

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/coordino/coordino/internal/schema"
	cniv1 "github.com/coordino/coordino/proto/cni/v1"
)

var sample = &Request{
	ContainerID: "c1", Netns: "/var/run/netns/x", IfName: "eth0",
	Args: "K8S_POD_NAME=p", Path: "/opt/cni/bin", Stdin: []byte(`{"cniVersion":"1.1.0"}`),
}

func TestRequestMatchesGeneratedCode(t *testing.T) {
	var got cniv1.CNIRequest
	enc, err := AppendRequest(nil, sample)
	if err != nil {
		t.Fatal(err)
	}
	if err := proto.Unmarshal(enc, &got); err != nil {
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
	stamp := schema.Stamp{Version: 3, MinReader: 2}
	enc, err := AppendQueuedDelete(nil, sample, 1234567890123, stamp)
	if err != nil {
		t.Fatal(err)
	}
	if err := proto.Unmarshal(enc, &got); err != nil {
		t.Fatal(err)
	}
	if got.QueuedUnixNano != 1234567890123 || got.Request.GetIfname() != "eth0" || got.SchemaVersion != 3 || got.SchemaMinReader != 2 {
		t.Fatalf("generated code decodes %v", &got)
	}
	data, _ := proto.Marshal(&got)
	req, at, st, err := DecodeQueuedDelete(data)
	if err != nil || at != 1234567890123 || req.Netns != sample.Netns || st != stamp {
		t.Fatalf("DecodeQueuedDelete = %+v %d %+v %v", req, at, st, err)
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

// Where wire and protobuf could part, wire does as protobuf does: it
// refuses strings that are not UTF-8 (both ways), skips a known field
// number with another wire type as unknown, skips unknown groups, and merges
// a message field that occurs twice.
func TestDecodersAgreeWithProtobuf(t *testing.T) {
	for name, c := range map[string]struct {
		data []byte
		want *Request
		err  error
	}{
		"invalid UTF-8 netns":         {[]byte{0x12, 0x01, 0xff}, nil, ErrInvalidUTF8},
		"invalid UTF-8 in stdin":      {[]byte{0x32, 0x01, 0xff}, &Request{Stdin: []byte{0xff}}, nil},
		"netns as a varint":           {[]byte{0x10, 0x05, 0x1a, 0x01, 'e'}, &Request{IfName: "e"}, nil},
		"unknown group":               {[]byte{0x0a, 0x01, 'c', 0x3b, 0x08, 0x01, 0x43, 0x44, 0x3c}, &Request{ContainerID: "c"}, nil},
		"group ended by another":      {[]byte{0x3b, 0x44}, nil, ErrMalformed},
		"group for a known field":     {[]byte{0x13, 0x14, 0x1a, 0x01, 'e'}, &Request{IfName: "e"}, nil},
		"end group without its start": {[]byte{0x3c}, nil, ErrMalformed},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := DecodeRequest(c.data)
			var ref cniv1.CNIRequest
			refErr := proto.Unmarshal(c.data, &ref)
			if (err == nil) != (refErr == nil) {
				t.Fatalf("wire: %v, protobuf: %v", err, refErr)
			}
			if c.err != nil {
				if !errors.Is(err, c.err) {
					t.Fatalf("err = %v, want %v", err, c.err)
				}
				return
			}
			if !sameRequest(got, c.want) || !sameRequest(requestOf(&ref), c.want) {
				t.Fatalf("wire %+v, protobuf %+v, want %+v", got, &ref, c.want)
			}
		})
	}
	// QueuedDelete.request twice: merged field by field.
	data := []byte{0x0a, 0x03, 0x0a, 0x01, 'a', 0x0a, 0x03, 0x12, 0x01, 'n'}
	req, _, _, err := DecodeQueuedDelete(data)
	if err != nil || req.ContainerID != "a" || req.Netns != "n" {
		t.Fatalf("merged request: %+v, %v", req, err)
	}
	if _, err := AppendRequest(nil, &Request{Args: "K8S_POD_NAME=\xff"}); !errors.Is(err, ErrInvalidUTF8) || !strings.Contains(err.Error(), "CNIRequest.args") {
		t.Fatalf("encoding invalid UTF-8: %v", err)
	}
}

func requestOf(m *cniv1.CNIRequest) *Request {
	return &Request{ContainerID: m.ContainerId, Netns: m.Netns, IfName: m.Ifname, Args: m.Args, Path: m.Path, Stdin: m.Stdin}
}

func protoRequest(r *Request) *cniv1.CNIRequest {
	return &cniv1.CNIRequest{ContainerId: r.ContainerID, Netns: r.Netns, Ifname: r.IfName, Args: r.Args, Path: r.Path, Stdin: r.Stdin}
}

func sameRequest(a, b *Request) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.ContainerID == b.ContainerID && a.Netns == b.Netns && a.IfName == b.IfName && a.Args == b.Args && a.Path == b.Path && bytes.Equal(a.Stdin, b.Stdin)
}

// agree fails t unless wire and protobuf gave the same verdict on data.
func agree(t *testing.T, data []byte, err, refErr error) bool {
	t.Helper()
	if (err == nil) != (refErr == nil) {
		t.Fatalf("%x: wire: %v, protobuf: %v", data, err, refErr)
	}
	return err == nil
}

// The differential fuzzers below decode the same bytes with wire and with
// the generated code and require the same verdict and the same values; then
// they encode the value with one and decode it with the other, both ways
// where wire has an encoder (the plugin encodes only CNIRequest and
// QueuedDelete).

func FuzzDecodeRequest(f *testing.F) {
	enc, _ := AppendRequest(nil, sample)
	f.Add(enc)
	f.Add([]byte{0x12, 0x01, 0xff})
	f.Add([]byte{0x0a, 0x01, 'c', 0x3b, 0x08, 0x01, 0x43, 0x44, 0x3c})
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := DecodeRequest(data)
		var ref cniv1.CNIRequest
		if !agree(t, data, err, proto.Unmarshal(data, &ref)) {
			return
		}
		if !sameRequest(got, requestOf(&ref)) {
			t.Fatalf("wire %+v, protobuf %v", got, &ref)
		}
		checkRequestBothWays(t, got)
	})
}

// checkRequestBothWays encodes r (and a QueuedDelete of it) with each codec
// and decodes it with the other.
func checkRequestBothWays(t *testing.T, r *Request) {
	t.Helper()
	want := protoRequest(r)
	enc, err := AppendRequest(nil, r)
	var back cniv1.CNIRequest
	if err != nil || proto.Unmarshal(enc, &back) != nil || !proto.Equal(&back, want) {
		t.Fatalf("wire encodes %+v, protobuf decodes %v (%v)", r, &back, err)
	}
	penc, err := proto.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	if again, err := DecodeRequest(penc); err != nil || !sameRequest(again, r) {
		t.Fatalf("protobuf encodes %v, wire decodes %+v, %v", want, again, err)
	}
	const at = -42
	qenc, err := AppendQueuedDelete(nil, r, at, schema.Stamp{})
	var q cniv1.QueuedDelete
	if err != nil || proto.Unmarshal(qenc, &q) != nil || q.QueuedUnixNano != at || !proto.Equal(q.Request, want) {
		t.Fatalf("wire encodes a QueuedDelete, protobuf decodes %v (%v)", &q, err)
	}
	qpenc, _ := proto.Marshal(&cniv1.QueuedDelete{Request: want, QueuedUnixNano: at})
	if again, got, _, err := DecodeQueuedDelete(qpenc); err != nil || got != at || !sameRequest(again, r) {
		t.Fatalf("protobuf encodes a QueuedDelete, wire decodes %+v %d, %v", again, got, err)
	}
}

// FuzzEncodeRequest starts from field values, valid UTF-8 or not: both
// encoders refuse the same requests, and what they write the other reads.
func FuzzEncodeRequest(f *testing.F) {
	f.Add(sample.ContainerID, sample.Netns, sample.IfName, sample.Args, sample.Path, sample.Stdin)
	f.Add("c", "/proc/1/ns/net\xff", "eth0", "", "", []byte{0xff})
	f.Fuzz(func(t *testing.T, id, netns, ifname, args, path string, stdin []byte) {
		r := &Request{ContainerID: id, Netns: netns, IfName: ifname, Args: args, Path: path, Stdin: stdin}
		_, err := AppendRequest(nil, r)
		_, refErr := proto.Marshal(protoRequest(r))
		if !agree(t, nil, err, refErr) {
			if !errors.Is(err, ErrInvalidUTF8) {
				t.Fatalf("refused with %v", err)
			}
			return
		}
		checkRequestBothWays(t, r)
	})
}

func FuzzDecodeQueuedDelete(f *testing.F) {
	enc, _ := AppendQueuedDelete(nil, sample, 42, schema.Stamp{Version: 2, MinReader: 1})
	f.Add(enc)
	f.Add([]byte{0x0a, 0x80})
	f.Add([]byte{0x0a, 0x03, 0x0a, 0x01, 'a', 0x0a, 0x03, 0x12, 0x01, 'n'})
	f.Fuzz(func(t *testing.T, data []byte) {
		req, at, st, err := DecodeQueuedDelete(data)
		var ref cniv1.QueuedDelete
		if !agree(t, data, err, proto.Unmarshal(data, &ref)) {
			return
		}
		var want *Request
		if ref.Request != nil {
			want = requestOf(ref.Request)
		}
		if at != ref.QueuedUnixNano || st.Version != ref.SchemaVersion || st.MinReader != ref.SchemaMinReader || !sameRequest(req, want) {
			t.Fatalf("wire %+v %d %+v, protobuf %v", req, at, st, &ref)
		}
		if req != nil {
			checkRequestBothWays(t, req)
		}
	})
}

func FuzzDecodeResponse(f *testing.F) {
	seed, _ := proto.Marshal(&cniv1.CNIResponse{Result: []byte(`{"cniVersion":"1.1.0"}`)})
	f.Add(seed)
	f.Add([]byte{0x08, 0x01, 0x0a, 0x00})
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := DecodeResponse(data)
		var ref cniv1.CNIResponse
		if !agree(t, data, err, proto.Unmarshal(data, &ref)) {
			return
		}
		if !bytes.Equal(got, ref.Result) {
			t.Fatalf("wire %q, protobuf %q", got, ref.Result)
		}
		penc, _ := proto.Marshal(&ref)
		if again, err := DecodeResponse(penc); err != nil || !bytes.Equal(again, got) {
			t.Fatalf("protobuf encodes %v, wire decodes %q, %v", &ref, again, err)
		}
	})
}

// refStatus is DecodeStatus done with the generated code: the status, then
// the first detail whose type is CNIError, unpacked.
func refStatus(data []byte) (*Status, *status.Status, error) {
	var ref status.Status
	if err := proto.Unmarshal(data, &ref); err != nil {
		return nil, nil, err
	}
	st := &Status{Code: ref.Code, Message: ref.Message}
	for _, d := range ref.Details {
		if d.TypeUrl == TypeURLCNIError {
			var ce cniv1.CNIError
			if err := proto.Unmarshal(d.Value, &ce); err != nil {
				return nil, nil, err
			}
			st.CNIError = &CNIError{Code: ce.Code, Msg: ce.Msg, Details: ce.Details}
			break
		}
	}
	return st, &ref, nil
}

func sameStatus(a, b *Status) bool {
	if a.Code != b.Code || a.Message != b.Message || (a.CNIError == nil) != (b.CNIError == nil) {
		return false
	}
	return a.CNIError == nil || *a.CNIError == *b.CNIError
}

func FuzzDecodeStatus(f *testing.F) {
	detail, _ := anypb.New(&cniv1.CNIError{Code: 7, Msg: "bad"})
	other, _ := anypb.New(&cniv1.CNIResponse{Result: []byte("x")})
	seed, _ := proto.Marshal(&status.Status{Code: 9, Message: "m", Details: []*anypb.Any{other, detail, detail}})
	f.Add(seed)
	f.Add([]byte{0x08, 0xff})
	f.Add([]byte{0x1a, 0x03, 0x0a, 0x01, 0xff})
	f.Fuzz(func(t *testing.T, data []byte) {
		st, err := DecodeStatus(data)
		want, ref, refErr := refStatus(data)
		if !agree(t, data, err, refErr) {
			return
		}
		if !sameStatus(st, want) {
			t.Fatalf("wire %+v %+v, protobuf %v", st, st.CNIError, ref)
		}
		penc, _ := proto.Marshal(ref)
		if again, err := DecodeStatus(penc); err != nil || !sameStatus(again, st) {
			t.Fatalf("protobuf encodes %v, wire decodes %+v, %v", ref, again, err)
		}
	})
}
