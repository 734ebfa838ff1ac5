package unarygrpc

import (
	"bytes"
	"context"
	"net"
	"testing"
	"time"

	"github.com/coordino/coordino/proto/cni/v1/wire"
)

// recorder keeps what a connection read.
type recorder struct {
	net.Conn
	got bytes.Buffer
}

func (r *recorder) Read(p []byte) (int, error) {
	n, err := r.Conn.Read(p)
	r.got.Write(p[:n])
	return n, err
}

// replay answers every call with the bytes a grpc-go server sent once.
type replay struct{ r bytes.Reader }

func (c *replay) Read(p []byte) (int, error)  { return c.r.Read(p) }
func (c *replay) Write(p []byte) (int, error) { return len(p), nil }

// BenchmarkCall is one ADD-sized call (1 KiB of config in, a 2 KiB result
// out): against a grpc-go server on a Unix socket, and replayed from what
// that server sent, which is the client's own work alone.
func BenchmarkCall(b *testing.B) {
	dial, _ := serve(b)
	req := &wire.Request{ContainerID: "ok", Netns: "/run/netns/x", IfName: "eth0", Path: "/opt/cni/bin", Stdin: bytes.Repeat([]byte{'c'}, 1024)}
	body, _ := wire.AppendRequest(nil, req)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b.Run("grpc-go server", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			conn := dial()
			if _, err := Call(ctx, conn, "/coordino.cni.v1.CNI/Add", nil, body); err != nil {
				b.Fatal(err)
			}
			conn.Close()
		}
	})
	rec := &recorder{Conn: dial()}
	if _, err := Call(ctx, rec, "/coordino.cni.v1.CNI/Add", nil, body); err != nil {
		b.Fatal(err)
	}
	answer := rec.got.Bytes()
	b.Run("replayed answer", func(b *testing.B) {
		b.ReportAllocs()
		c := &replay{}
		for b.Loop() {
			c.r.Reset(answer)
			if _, err := Call(ctx, c, "/coordino.cni.v1.CNI/Add", nil, body); err != nil {
				b.Fatal(err)
			}
		}
	})
}
