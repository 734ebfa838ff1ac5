package unarygrpc

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"

	cniv1 "github.com/coordino/coordino/proto/cni/v1"
	"github.com/coordino/coordino/proto/cni/v1/wire"
)

// peer is a scripted HTTP/2 server on a Unix socket: the test writes and
// reads its frames one by one, strict where grpc-go would be lenient.
type peer struct {
	fr  *http2.Framer
	enc *hpack.Encoder
	buf bytes.Buffer
}

// rawPeer serves one connection with script and returns the client's end.
// After the script, the peer reads what the client still sends until it
// hangs up; goAway then holds the code of the client's GOAWAY, if any.
func rawPeer(t *testing.T, script func(p *peer)) (conn net.Conn, goAway <-chan http2.ErrCode) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "p.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	codes := make(chan http2.ErrCode, 1)
	go func() {
		defer close(codes)
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		if _, err := io.ReadFull(c, make([]byte, len(http2.ClientPreface))); err != nil {
			return
		}
		p := &peer{fr: http2.NewFramer(c, c)}
		p.fr.AllowIllegalWrites = true
		p.fr.AllowIllegalReads = true
		p.enc = hpack.NewEncoder(&p.buf)
		script(p)
		for {
			f, err := p.fr.ReadFrame()
			if err != nil {
				return
			}
			if g, ok := f.(*http2.GoAwayFrame); ok {
				codes <- g.ErrCode
			}
		}
	}()
	conn, err = net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn, codes
}

func (p *peer) block(fields ...string) []byte {
	p.buf.Reset()
	for i := 0; i < len(fields); i += 2 {
		p.enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
	}
	return append([]byte(nil), p.buf.Bytes()...)
}

// respond answers stream 1 with msg: headers, one DATA, trailers.
func (p *peer) respond(msg []byte) {
	p.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, EndHeaders: true,
		BlockFragment: p.block(":status", "200", "content-type", "application/grpc")})
	p.fr.WriteData(1, false, append(binary.BigEndian.AppendUint32([]byte{0}, uint32(len(msg))), msg...))
	p.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, EndHeaders: true, EndStream: true, BlockFragment: p.block("grpc-status", "0")})
}

// A server that stops the moment its trailers are in the socket has put the
// whole answer there; the client's SETTINGS ACK and WINDOW_UPDATEs then fail
// with EPIPE, which must not cost it the answer.
func TestCallGetsTheAnswerOfAServerThatStopsAtOnce(t *testing.T) {
	for _, size := range []int{100, 100 << 10} {
		lost := 0
		var last error
		for i := 0; i < 20; i++ {
			sock := filepath.Join(t.TempDir(), "s.sock")
			l, err := net.Listen("unix", sock)
			if err != nil {
				t.Fatal(err)
			}
			g := grpc.NewServer()
			cniv1.RegisterCNIServer(g, &server{trace: make(chan string, 1)})
			go g.Serve(&stopAfterTrailers{Listener: l, stop: g.Stop})
			conn, err := net.Dial("unix", sock)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			got, err := add(t, ctx, conn, nil, &wire.Request{ContainerID: "ok", Stdin: bytes.Repeat([]byte{'x'}, size/2)})
			cancel()
			conn.Close()
			g.Stop()
			if err != nil || len(got) != size {
				lost++
				last = err
			}
		}
		if lost > 0 {
			t.Errorf("answers of %d bytes: lost %d of 20, last: %v", size, lost, last)
		}
	}
}

// stopAfterTrailers stops the server as soon as a connection has written a
// HEADERS frame that ends stream 1: the call's trailers.
type stopAfterTrailers struct {
	net.Listener
	stop func()
}

func (l *stopAfterTrailers) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	return &trailerWatch{Conn: c, stop: l.stop}, err
}

type trailerWatch struct {
	net.Conn
	stop    func()
	hdr     []byte // the frame header being written
	skip    int    // payload bytes of the current frame still to come
	trailer bool   // the current frame is stream 1's last HEADERS
}

func (c *trailerWatch) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	for p := b[:n]; len(p) > 0; {
		if c.skip > 0 {
			k := min(c.skip, len(p))
			c.skip, p = c.skip-k, p[k:]
		} else {
			k := min(9-len(c.hdr), len(p))
			c.hdr, p = append(c.hdr, p[:k]...), p[k:]
			if len(c.hdr) < 9 {
				continue
			}
			c.skip = int(c.hdr[0])<<16 | int(c.hdr[1])<<8 | int(c.hdr[2])
			c.trailer = c.hdr[3] == frameHeaders && c.hdr[4]&flagEndStream != 0 && binary.BigEndian.Uint32(c.hdr[5:]) == 1
			c.hdr = c.hdr[:0]
		}
		if c.skip == 0 && c.trailer {
			c.trailer = false
			go c.stop()
		}
	}
	return n, err
}

// A peer that changes SETTINGS_INITIAL_WINDOW_SIZE more than once must see
// the stream's window follow each change (RFC 9113 §6.9.2): the client never
// sends more than the last value allows. The peer grants the connection
// plenty, the stream nothing, and answers once the client has used the
// stream's window, so a client that overruns it has done so by then.
func TestCallKeepsToTheWindowAcrossSettings(t *testing.T) {
	for name, settings := range map[string][][]uint32{
		"one frame, twice the same":  {{131070, 131070}},
		"two frames, the same":       {{131070}, {131070}},
		"one frame, up then down":    {{200000, 70000}},
		"two frames, up then down":   {{200000}, {70000}},
		"one frame, down then up":    {{30000, 100000}},
		"unchanged from the default": {{65535, 65535}},
	} {
		t.Run(name, func(t *testing.T) {
			window := int(settings[len(settings)-1][len(settings[len(settings)-1])-1])
			received := make(chan int, 1)
			conn, _ := rawPeer(t, func(p *peer) {
				for _, frame := range settings {
					var s []http2.Setting
					for _, v := range frame {
						s = append(s, http2.Setting{ID: http2.SettingInitialWindowSize, Val: v})
					}
					p.fr.WriteSettings(s...)
				}
				p.fr.WriteWindowUpdate(0, 1<<24)
				n, answered := 0, false
				defer func() { received <- n }()
				for {
					f, err := p.fr.ReadFrame()
					if err != nil {
						return
					}
					if d, ok := f.(*http2.DataFrame); ok {
						n += len(d.Data())
					}
					if n >= window && !answered {
						p.respond([]byte("answer"))
						answered = true
					}
				}
			})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			got, err := Call(ctx, conn, "/x/y", nil, make([]byte, 300000))
			if err != nil || string(got) != "answer" {
				t.Fatalf("call: %q, %v", got, err)
			}
			conn.Close()
			if n := <-received; n > window {
				t.Fatalf("the client sent %d bytes of DATA into a stream window of %d", n, window)
			}
		})
	}
}

// A header block spread over CONTINUATION frames is bounded: the client
// stops reading it past maxHeaderBlock instead of buffering it all.
func TestCallBoundsTheHeaderBlock(t *testing.T) {
	sent := make(chan int, 1)
	conn, goAway := rawPeer(t, func(p *peer) {
		p.fr.WriteSettings()
		// A valid block of 8 MiB: padding fields, then a trailers-only answer.
		// Each padding field is a literal the decoder indexes (and evicts).
		pad := p.block("x-pad", strings.Repeat("p", 1000))
		block := bytes.Repeat(pad, (8<<20)/len(pad)+1)
		block = append(block, p.block(":status", "200", "content-type", "application/grpc", "grpc-status", "0")...)
		n := 0
		defer func() { sent <- n }()
		if p.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, EndStream: true, BlockFragment: block[:16384]}) != nil {
			return
		}
		for n = 16384; n < len(block); n += 16384 {
			end := min(n+16384, len(block))
			if p.fr.WriteContinuation(1, end == len(block), block[n:end]) != nil {
				return
			}
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := Call(ctx, conn, "/x/y", nil, []byte("req"))
	var st *Status
	if !errors.As(err, &st) || st.Code != CodeUnavailable || !strings.Contains(st.Message, "header block exceeds 1048576 bytes") {
		t.Fatalf("8 MiB header block: %v", err)
	}
	conn.Close()
	if code := <-goAway; code != http2.ErrCodeProtocol {
		t.Fatalf("GOAWAY %v, want PROTOCOL_ERROR", code)
	}
	if n := <-sent; n > 4<<20 {
		t.Fatalf("the client read %d bytes of header block", n)
	}
}

// Frames and settings that break RFC 9113 end the call at once with a
// connection error that says what was wrong, and the client tells the
// server in a GOAWAY. Each script then sends a valid answer, which a client
// that let the violation pass would take.
func TestCallRefusesProtocolViolations(t *testing.T) {
	settings := func(id http2.SettingID, v uint32) func(p *peer) {
		return func(p *peer) { p.fr.WriteSettings(http2.Setting{ID: id, Val: v}) }
	}
	then := func(steps ...func(p *peer)) func(p *peer) {
		return func(p *peer) {
			for _, s := range steps {
				s(p)
			}
		}
	}
	empty := func(p *peer) { p.fr.WriteSettings() }
	headers := func(p *peer) {
		p.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, EndHeaders: true, BlockFragment: p.block(":status", "200", "content-type", "application/grpc")})
	}
	raw := func(typ http2.FrameType, flags http2.Flags, stream uint32, payload []byte) func(p *peer) {
		return func(p *peer) { p.fr.WriteRawFrame(typ, flags, stream, payload) }
	}
	for _, c := range []struct {
		name   string
		script func(p *peer)
		code   http2.ErrCode
		want   string
	}{
		{"max frame size 0", settings(http2.SettingMaxFrameSize, 0), http2.ErrCodeProtocol, "SETTINGS_MAX_FRAME_SIZE 0"},
		{"max frame size 2^24", settings(http2.SettingMaxFrameSize, 1<<24), http2.ErrCodeProtocol, "SETTINGS_MAX_FRAME_SIZE 16777216"},
		{"initial window 2^31", settings(http2.SettingInitialWindowSize, 1<<31), http2.ErrCodeFlowControl, "SETTINGS_INITIAL_WINDOW_SIZE 2147483648"},
		{"push enabled", settings(http2.SettingEnablePush, 1), http2.ErrCodeProtocol, "SETTINGS_ENABLE_PUSH 1"},
		{"SETTINGS of 5 bytes", raw(http2.FrameSettings, 0, 0, make([]byte, 5)), http2.ErrCodeFrameSize, "not a multiple of 6"},
		{"first frame not SETTINGS", raw(http2.FramePing, 0, 0, make([]byte, 8)), http2.ErrCodeProtocol, "PING as its first frame"},
		{"SETTINGS ACK with payload", then(empty, raw(http2.FrameSettings, 1, 0, make([]byte, 6))), http2.ErrCodeFrameSize, "SETTINGS ACK with 6 bytes"},
		{"frame over 16384 bytes", then(empty, headers, func(p *peer) { p.fr.WriteData(1, false, make([]byte, 20000)) }), http2.ErrCodeFrameSize, "DATA (type 0x0) of 20000 bytes exceeds"},
		{"DATA on stream 0", then(empty, headers, raw(http2.FrameData, 0, 0, []byte("x"))), http2.ErrCodeProtocol, "DATA on stream 0"},
		{"HEADERS on stream 0", then(empty, raw(http2.FrameHeaders, 4, 0, []byte{0x88})), http2.ErrCodeProtocol, "HEADERS on stream 0"},
		{"RST_STREAM on stream 0", then(empty, raw(http2.FrameRSTStream, 0, 0, make([]byte, 4))), http2.ErrCodeProtocol, "RST_STREAM on stream 0"},
		{"SETTINGS on stream 1", then(empty, raw(http2.FrameSettings, 0, 1, nil)), http2.ErrCodeProtocol, "SETTINGS on stream 1"},
		{"PING on stream 1", then(empty, raw(http2.FramePing, 0, 1, make([]byte, 8))), http2.ErrCodeProtocol, "PING on stream 1"},
		{"PING of 4 bytes", then(empty, raw(http2.FramePing, 0, 0, make([]byte, 4))), http2.ErrCodeFrameSize, "PING of 4 bytes"},
		{"GOAWAY on stream 1", then(empty, raw(http2.FrameGoAway, 0, 1, make([]byte, 8))), http2.ErrCodeProtocol, "GOAWAY on stream 1"},
		// Another stream's header block would put the HPACK table out of step.
		{"HEADERS on an unopened stream", then(empty, func(p *peer) {
			p.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, EndHeaders: true, BlockFragment: p.block("x-other", "v")})
		}), http2.ErrCodeProtocol, "HEADERS on stream 3, which the client never opened"},
		{"DATA on an unopened stream", then(empty, headers, func(p *peer) { p.fr.WriteData(5, false, []byte("x")) }), http2.ErrCodeProtocol, "DATA on stream 5"},
		{"WINDOW_UPDATE on an unopened stream", then(empty, func(p *peer) { p.fr.WriteWindowUpdate(7, 1) }), http2.ErrCodeProtocol, "WINDOW_UPDATE on stream 7"},
		{"WINDOW_UPDATE of 0", then(empty, raw(http2.FrameWindowUpdate, 0, 0, make([]byte, 4))), http2.ErrCodeProtocol, "WINDOW_UPDATE of 0"},
		{"connection window past 2^31-1", then(empty, func(p *peer) { p.fr.WriteWindowUpdate(0, 1<<31-1) }), http2.ErrCodeFlowControl, "past 2^31-1"},
		{"PUSH_PROMISE", then(empty, headers, raw(http2.FramePushPromise, 4, 1, []byte{0, 0, 0, 2, 0x82})), http2.ErrCodeProtocol, "PUSH_PROMISE"},
		{"DATA before HEADERS", then(empty, func(p *peer) { p.fr.WriteData(1, false, []byte{0, 0, 0, 0, 0}) }), http2.ErrCodeProtocol, "DATA before the response headers"},
		{"header block interrupted", then(empty, func(p *peer) {
			p.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: p.block(":status", "200")})
			p.fr.WritePing(false, [8]byte{})
		}), http2.ErrCodeProtocol, "PING on stream 0 inside the header block"},
		{"CONTINUATION without HEADERS", then(empty, raw(http2.FrameContinuation, 4, 1, []byte{0x88})), http2.ErrCodeProtocol, "CONTINUATION without HEADERS"},
		{"bad padding", then(empty, headers, raw(http2.FrameData, 8, 1, []byte{9, 0})), http2.ErrCodeProtocol, "padding of 9 bytes"},
		{"malformed header block", then(empty, raw(http2.FrameHeaders, 4, 1, []byte{0x80})), http2.ErrCodeCompression, "header block"},
	} {
		t.Run(c.name, func(t *testing.T) {
			conn, goAway := rawPeer(t, func(p *peer) {
				c.script(p)
				p.respond([]byte("answer"))
			})
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			start := time.Now()
			got, err := Call(ctx, conn, "/x/y", nil, []byte("req"))
			var st *Status
			if !errors.As(err, &st) || st.Code != CodeUnavailable || !strings.Contains(st.Message, c.want) {
				t.Fatalf("got %q, %v; want Unavailable naming %q", got, err, c.want)
			}
			if took := time.Since(start); took > time.Second {
				t.Fatalf("the error took %v", took)
			}
			conn.Close()
			if code, ok := <-goAway; !ok || code != c.code {
				t.Fatalf("client's GOAWAY: %v (sent: %v), want %v", code, ok, c.code)
			}
		})
	}
}

// Frames the protocol allows anywhere are taken: PRIORITY on any stream,
// unknown frame types, settings the client does not use, a GOAWAY that
// lets the call finish.
func TestCallTakesWhatTheProtocolAllows(t *testing.T) {
	conn, _ := rawPeer(t, func(p *peer) {
		p.fr.WriteSettings(http2.Setting{ID: http2.SettingMaxFrameSize, Val: 1<<24 - 1}, http2.Setting{ID: http2.SettingHeaderTableSize, Val: 0},
			http2.Setting{ID: 0x99, Val: 12345})
		p.fr.WritePriority(9, http2.PriorityParam{Weight: 3})
		p.fr.WriteRawFrame(0x42, 0xff, 11, []byte("unknown"))
		p.fr.WriteGoAway(1, http2.ErrCodeNo, []byte("draining"))
		p.fr.WriteWindowUpdate(1, 10)
		p.respond([]byte("answer"))
	})
	got, err := Call(context.Background(), conn, "/x/y", nil, []byte("req"))
	if err != nil || string(got) != "answer" {
		t.Fatalf("call: %q, %v", got, err)
	}
}

// timeoutConn takes the request, then times out every write, as a blocking
// socket with SO_SNDTIMEO does; a read past the server's SETTINGS blocks.
type timeoutConn struct {
	writes int
	r      io.Reader
}

func (c *timeoutConn) Write(p []byte) (int, error) {
	if c.writes++; c.writes > 1 {
		return 0, syscall.EAGAIN
	}
	return len(p), nil
}

func (c *timeoutConn) Read(p []byte) (int, error) {
	if n, _ := c.r.Read(p); n > 0 {
		return n, nil
	}
	select {} // a server that says nothing more
}

// A write that timed out ends the call: reading on would wait past its
// deadline.
func TestCallEndsOnAWriteTimeout(t *testing.T) {
	c := &timeoutConn{r: bytes.NewReader([]byte{0, 0, 0, 4, 0, 0, 0, 0, 0})}
	done := make(chan error, 1)
	go func() { _, err := Call(context.Background(), c, "/x/y", nil, []byte("req")); done <- err }()
	select {
	case err := <-done:
		var st *Status
		if !errors.As(err, &st) || st.Code != CodeDeadlineExceeded {
			t.Fatalf("err = %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the call read on after its write timed out")
	}
}
