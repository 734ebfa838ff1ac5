package unarygrpc

import (
	"bytes"
	"context"
	"errors"
	"net"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	cniv1 "github.com/coordino/coordino/proto/cni/v1"
	"github.com/coordino/coordino/proto/cni/v1/wire"
)

// server is a grpc-go CNI server, as the daemon runs one.
type server struct {
	cniv1.UnimplementedCNIServer
	trace chan string
}

func (s *server) Add(ctx context.Context, req *cniv1.CNIRequest) (*cniv1.CNIResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get("traceparent"); len(v) == 1 {
		s.trace <- v[0]
	}
	switch req.ContainerId {
	case "fail":
		st, _ := status.New(codes.FailedPrecondition, "bad mtu: 100%").WithDetails(&cniv1.CNIError{Code: 7, Msg: "mtu", Details: "d"})
		return nil, st.Err()
	case "slow":
		<-ctx.Done()
		return nil, ctx.Err()
	}
	// Echo stdin back doubled: large requests give large responses.
	return &cniv1.CNIResponse{Result: append(append([]byte{}, req.Stdin...), req.Stdin...)}, nil
}

func serve(t testing.TB) (dial func() net.Conn, s *server) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "s.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	s = &server{trace: make(chan string, 1)}
	g := grpc.NewServer()
	cniv1.RegisterCNIServer(g, s)
	go g.Serve(l)
	t.Cleanup(g.Stop)
	return func() net.Conn {
		c, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}, s
}

func add(t *testing.T, ctx context.Context, conn net.Conn, md []Header, req *wire.Request) ([]byte, error) {
	t.Helper()
	body, err := wire.AppendRequest(nil, req)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := Call(ctx, conn, "/coordino.cni.v1.CNI/Add", md, body)
	if err != nil {
		return nil, err
	}
	return wire.DecodeResponse(resp)
}

func TestCallAgainstGRPCServer(t *testing.T) {
	dial, s := serve(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, size := range []int{0, 10, 70 << 10, 1 << 20} { // beyond the 64 KiB initial windows both ways
		stdin := bytes.Repeat([]byte{'x'}, size)
		got, err := add(t, ctx, dial(), []Header{{"traceparent", "00-abc-def-01"}}, &wire.Request{ContainerID: "ok", Stdin: stdin})
		if err != nil || len(got) != 2*size {
			t.Fatalf("size %d: got %d bytes, %v", size, len(got), err)
		}
		if tp := <-s.trace; tp != "00-abc-def-01" {
			t.Fatalf("traceparent arrived as %q", tp)
		}
	}
}

func TestCallCarriesStatusDetails(t *testing.T) {
	dial, _ := serve(t)
	_, err := add(t, context.Background(), dial(), nil, &wire.Request{ContainerID: "fail"})
	var st *Status
	if !errors.As(err, &st) || st.Code != int(codes.FailedPrecondition) || st.Message != "bad mtu: 100%" {
		t.Fatalf("err = %v", err)
	}
	details, derr := wire.DecodeStatus(st.Details)
	if derr != nil || details.CNIError == nil || *details.CNIError != (wire.CNIError{Code: 7, Msg: "mtu", Details: "d"}) {
		t.Fatalf("details = %+v, %v", details, derr)
	}
}

func TestCallDeadlineAndBrokenConnection(t *testing.T) {
	dial, _ := serve(t)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err := add(t, ctx, dial(), nil, &wire.Request{ContainerID: "slow"})
	var st *Status
	if !errors.As(err, &st) || st.Code != CodeDeadlineExceeded {
		t.Fatalf("slow call: %v", err)
	}

	// A peer that hangs up without answering is Unavailable, as gRPC reports it.
	a, b := net.Pipe()
	go func() { buf := make([]byte, 1024); b.Read(buf); b.Close() }()
	_, err = Call(context.Background(), a, "/x/y", nil, nil)
	if !errors.As(err, &st) || st.Code != CodeUnavailable {
		t.Fatalf("hung-up peer: %v", err)
	}
}

func FuzzResponseFrames(f *testing.F) {
	// Server bytes after our request: SETTINGS, then a trailers-only HEADERS.
	f.Add([]byte{0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0, 1, 1, 5, 0, 0, 0, 1, 0x88})
	f.Fuzz(func(t *testing.T, data []byte) {
		a, b := net.Pipe()
		defer a.Close() // unblocks the server side when Call stops reading early
		go func() {
			go func() {
				buf := make([]byte, 4096)
				for {
					if _, err := b.Read(buf); err != nil {
						return
					}
				}
			}()
			b.Write(data)
			b.Close()
		}()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := Call(ctx, a, "/x/y", nil, []byte("req"))
		var st *Status
		if err != nil && !errors.As(err, &st) {
			t.Fatalf("error is not a Status: %v", err)
		}
	})
}
