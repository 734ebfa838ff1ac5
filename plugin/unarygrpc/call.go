package unarygrpc

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// gRPC status codes the caller acts on.
const (
	CodeOK                = 0
	CodeCanceled          = 1
	CodeUnknown           = 2
	CodeDeadlineExceeded  = 4
	CodePermissionDenied  = 7
	CodeResourceExhausted = 8
	CodeInternal          = 13
	CodeUnavailable       = 14
)

// Status is a call's non-OK outcome: from the server's trailers, or
// synthesised for transport failures as a gRPC client would (Unavailable when
// the connection broke, DeadlineExceeded when the context expired).
type Status struct {
	Code    int
	Message string
	// Details is the decoded grpc-status-details-bin trailer: a serialised
	// google.rpc.Status, or nil.
	Details []byte
}

func (s *Status) Error() string {
	return fmt.Sprintf("rpc error: code = %d desc = %s", s.Code, s.Message)
}

// Header is one request metadata entry (lower-case name), e.g. traceparent.
type Header struct{ Name, Value string }

// HTTP/2 frame types and flags (RFC 9113 §6).
const (
	frameData         = 0x0
	frameHeaders      = 0x1
	frameRSTStream    = 0x3
	frameSettings     = 0x4
	framePing         = 0x6
	frameGoAway       = 0x7
	frameWindowUpdate = 0x8
	frameContinuation = 0x9

	flagEndStream  = 0x1
	flagAck        = 0x1
	flagEndHeaders = 0x4
	flagPadded     = 0x8
	flagPriority   = 0x20

	settingInitialWindowSize = 0x4
	settingMaxFrameSize      = 0x5

	defaultWindow       = 65535
	defaultMaxFrameSize = 16384
	maxMessage          = 64 << 20
	streamID            = 1
)

const preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// Call sends req to method (e.g. "/coordino.cni.v1.CNI/Add") on conn, which
// it owns for the call's duration (the caller closes it), and returns the
// response message or a *Status. ctx's deadline bounds the call: it is set
// on conn when conn supports deadlines; otherwise the caller bounds conn's
// reads and writes itself (a blocking socket with SO_RCVTIMEO, say).
func Call(ctx context.Context, conn io.ReadWriter, method string, md []Header, req []byte) ([]byte, error) {
	if deadline, ok := ctx.Deadline(); ok {
		if d, ok := conn.(interface{ SetDeadline(time.Time) error }); ok {
			_ = d.SetDeadline(deadline)
		}
	}
	c := &call{conn: conn, r: bufio.NewReaderSize(conn, 16<<10), sendWindow: defaultWindow, connWindow: defaultWindow, maxFrame: defaultMaxFrameSize}
	resp, err := c.run(ctx, method, md, req)
	if err == nil {
		return resp, nil
	}
	var st *Status
	if errors.As(err, &st) {
		return nil, st
	}
	if ctx.Err() != nil || errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, syscall.EAGAIN) {
		if errors.Is(ctx.Err(), context.Canceled) {
			return nil, &Status{Code: CodeCanceled, Message: err.Error()}
		}
		return nil, &Status{Code: CodeDeadlineExceeded, Message: err.Error()}
	}
	return nil, &Status{Code: CodeUnavailable, Message: err.Error()}
}

type call struct {
	conn io.ReadWriter
	r    *bufio.Reader
	// Send windows: the stream's and the connection's (RFC 9113 §6.9).
	sendWindow, connWindow int64
	maxFrame               int
	hdr                    [9]byte
	out                    []byte
}

func (c *call) frame(typ, flags byte, stream uint32, payload []byte) {
	n := len(payload)
	c.out = append(c.out, byte(n>>16), byte(n>>8), byte(n), typ, flags)
	c.out = binary.BigEndian.AppendUint32(c.out, stream)
	c.out = append(c.out, payload...)
}

func (c *call) flush() error {
	_, err := c.conn.Write(c.out)
	c.out = c.out[:0]
	return err
}

func timeoutHeader(ctx context.Context) (string, bool) {
	deadline, ok := ctx.Deadline()
	if !ok {
		return "", false
	}
	ms := time.Until(deadline).Milliseconds()
	if ms < 1 {
		ms = 1
	}
	if ms > 99999999 {
		return strconv.FormatInt(ms/1000, 10) + "S", true
	}
	return strconv.FormatInt(ms, 10) + "m", true
}

func (c *call) run(ctx context.Context, method string, md []Header, req []byte) ([]byte, error) {
	if len(req) > maxMessage {
		return nil, &Status{Code: CodeResourceExhausted, Message: fmt.Sprintf("request of %d bytes exceeds %d", len(req), maxMessage)}
	}
	c.out = append(c.out, preface...)
	c.frame(frameSettings, 0, 0, []byte{0, 0x2, 0, 0, 0, 0}) // SETTINGS_ENABLE_PUSH = 0

	var block []byte
	headers := []Header{
		{":method", "POST"}, {":scheme", "http"}, {":path", method}, {":authority", "localhost"},
		{"content-type", "application/grpc"}, {"te", "trailers"},
	}
	if t, ok := timeoutHeader(ctx); ok {
		headers = append(headers, Header{"grpc-timeout", t})
	}
	for _, h := range append(headers, md...) {
		block = appendHeaderField(block, h.Name, h.Value)
	}
	if len(block) > defaultMaxFrameSize {
		return nil, &Status{Code: CodeInternal, Message: "request headers exceed one frame"}
	}
	c.frame(frameHeaders, flagEndHeaders, streamID, block)

	body := make([]byte, 5, 5+len(req))
	binary.BigEndian.PutUint32(body[1:], uint32(len(req)))
	body = append(body, req...)
	resp := response{dec: newHpackDecoder()}
	for sent := 0; sent < len(body); {
		n := min(int64(len(body)-sent), c.sendWindow, c.connWindow, int64(c.maxFrame))
		if n <= 0 {
			// Out of window: read until the server grants more.
			if err := c.flush(); err != nil {
				return nil, err
			}
			if err := c.readFrame(&resp); err != nil {
				return nil, err
			}
			if resp.done {
				return resp.result()
			}
			continue
		}
		var flags byte
		if sent+int(n) == len(body) {
			flags = flagEndStream
		}
		c.frame(frameData, flags, streamID, body[sent:sent+int(n)])
		sent += int(n)
		c.sendWindow -= n
		c.connWindow -= n
	}
	if err := c.flush(); err != nil {
		return nil, err
	}
	for !resp.done {
		if err := c.readFrame(&resp); err != nil {
			return nil, err
		}
	}
	return resp.result()
}

// response accumulates the server's side of the stream.
type response struct {
	dec         *hpackDecoder
	sawHeaders  bool
	status      string // :status
	grpcStatus  string
	grpcMessage string
	details     string
	data        []byte
	block       []byte // header block awaiting CONTINUATION
	blockEnd    bool   // END_STREAM of the HEADERS being continued
	done        bool
}

func (c *call) readFrame(resp *response) error {
	if _, err := io.ReadFull(c.r, c.hdr[:]); err != nil {
		return fmt.Errorf("read frame: %w", err)
	}
	length := int(c.hdr[0])<<16 | int(c.hdr[1])<<8 | int(c.hdr[2])
	typ, flags := c.hdr[3], c.hdr[4]
	stream := binary.BigEndian.Uint32(c.hdr[5:]) & 0x7fffffff
	if length > 1<<24-1 || length > maxMessage {
		return errors.New("frame too large")
	}
	payload := make([]byte, length)
	if _, err := io.ReadFull(c.r, payload); err != nil {
		return fmt.Errorf("read frame: %w", err)
	}
	if resp.block != nil && typ != frameContinuation {
		return errors.New("protocol error: header block interrupted")
	}
	switch typ {
	case frameSettings:
		if flags&flagAck != 0 {
			return nil
		}
		if len(payload)%6 != 0 {
			return errors.New("protocol error: bad SETTINGS")
		}
		for p := payload; len(p) >= 6; p = p[6:] {
			v := int64(binary.BigEndian.Uint32(p[2:]))
			switch binary.BigEndian.Uint16(p) {
			case settingInitialWindowSize:
				c.sendWindow += v - defaultWindow // only our stream exists
			case settingMaxFrameSize:
				c.maxFrame = int(v)
			}
		}
		c.frame(frameSettings, flagAck, 0, nil)
		return c.flush()
	case framePing:
		if flags&flagAck == 0 {
			c.frame(framePing, flagAck, 0, payload)
			return c.flush()
		}
	case frameWindowUpdate:
		if len(payload) != 4 {
			return errors.New("protocol error: bad WINDOW_UPDATE")
		}
		inc := int64(binary.BigEndian.Uint32(payload) & 0x7fffffff)
		if stream == 0 {
			c.connWindow += inc
		} else if stream == streamID {
			c.sendWindow += inc
		}
	case frameGoAway:
		if len(payload) >= 8 && binary.BigEndian.Uint32(payload)&0x7fffffff < streamID {
			return errors.New("server sent GOAWAY before serving the call")
		}
	case frameRSTStream:
		if stream == streamID && len(payload) == 4 {
			return rstStatus(binary.BigEndian.Uint32(payload))
		}
	case frameData:
		if stream != streamID {
			return nil
		}
		data, err := unpad(flags, payload)
		if err != nil {
			return err
		}
		if len(resp.data)+len(data) > maxMessage+5 {
			return &Status{Code: CodeResourceExhausted, Message: "response too large"}
		}
		resp.data = append(resp.data, data...)
		if length > 0 {
			// Return the window at once: the call consumes everything it gets.
			inc := binary.BigEndian.AppendUint32(nil, uint32(length))
			c.frame(frameWindowUpdate, 0, 0, inc)
			if flags&flagEndStream == 0 {
				c.frame(frameWindowUpdate, 0, streamID, inc)
			}
			if err := c.flush(); err != nil {
				return err
			}
		}
		if flags&flagEndStream != 0 {
			resp.done = true
		}
	case frameHeaders:
		if stream != streamID {
			return nil
		}
		block, err := unpad(flags, payload)
		if err != nil {
			return err
		}
		if flags&flagPriority != 0 {
			if len(block) < 5 {
				return errors.New("protocol error: short HEADERS")
			}
			block = block[5:]
		}
		resp.blockEnd = flags&flagEndStream != 0
		if flags&flagEndHeaders == 0 {
			resp.block = append([]byte{}, block...)
			return nil
		}
		return resp.headers(block)
	case frameContinuation:
		if resp.block == nil || stream != streamID {
			return errors.New("protocol error: unexpected CONTINUATION")
		}
		resp.block = append(resp.block, payload...)
		if flags&flagEndHeaders != 0 {
			block := resp.block
			resp.block = nil
			return resp.headers(block)
		}
	}
	return nil
}

func unpad(flags byte, p []byte) ([]byte, error) {
	if flags&flagPadded == 0 {
		return p, nil
	}
	if len(p) < 1 || int(p[0]) > len(p)-1 {
		return nil, errors.New("protocol error: bad padding")
	}
	return p[1 : len(p)-int(p[0])], nil
}

// headers takes a complete header block: the response headers, the
// trailers, or both at once (trailers-only).
func (r *response) headers(block []byte) error {
	err := r.dec.decode(block, func(name, value string) {
		switch name {
		case ":status":
			r.status = value
		case "grpc-status":
			r.grpcStatus = value
		case "grpc-message":
			r.grpcMessage = value
		case "grpc-status-details-bin":
			r.details = value
		}
	})
	if err != nil {
		return fmt.Errorf("decode headers: %w", err)
	}
	r.sawHeaders = true
	if r.blockEnd {
		r.done = true
	}
	return nil
}

func (r *response) result() ([]byte, error) {
	if r.status != "200" {
		return nil, &Status{Code: httpStatusCode(r.status), Message: "unexpected HTTP status " + r.status}
	}
	if r.grpcStatus == "" {
		return nil, &Status{Code: CodeInternal, Message: "server closed the stream without grpc-status"}
	}
	code, err := strconv.Atoi(r.grpcStatus)
	if err != nil {
		return nil, &Status{Code: CodeInternal, Message: "malformed grpc-status " + strconv.Quote(r.grpcStatus)}
	}
	if code != CodeOK {
		msg, err := url.PathUnescape(r.grpcMessage)
		if err != nil {
			msg = r.grpcMessage
		}
		st := &Status{Code: code, Message: msg}
		if r.details != "" {
			st.Details, _ = base64.RawStdEncoding.DecodeString(strings.TrimRight(r.details, "="))
		}
		return nil, st
	}
	if len(r.data) < 5 {
		return nil, &Status{Code: CodeInternal, Message: "response without a message"}
	}
	if r.data[0] != 0 {
		return nil, &Status{Code: CodeInternal, Message: "compressed response not supported"}
	}
	n := binary.BigEndian.Uint32(r.data[1:5])
	if int64(n) != int64(len(r.data)-5) {
		return nil, &Status{Code: CodeInternal, Message: fmt.Sprintf("response framing: %d bytes announced, %d received", n, len(r.data)-5)}
	}
	return r.data[5:], nil
}

// httpStatusCode maps a non-200 HTTP status as gRPC clients do.
func httpStatusCode(s string) int {
	switch s {
	case "400":
		return CodeInternal
	case "401":
		return 16
	case "403":
		return CodePermissionDenied
	case "404":
		return 12
	case "429", "502", "503", "504":
		return CodeUnavailable
	}
	return CodeUnknown
}

// rstStatus maps an HTTP/2 error code that reset the stream (gRPC's table).
func rstStatus(code uint32) *Status {
	msg := fmt.Sprintf("stream reset by server, HTTP/2 error code %d", code)
	switch code {
	case 0x7: // REFUSED_STREAM
		return &Status{Code: CodeUnavailable, Message: msg}
	case 0x8: // CANCEL: this client never cancels, so the server's deadline (grpc-timeout) expired
		return &Status{Code: CodeDeadlineExceeded, Message: msg}
	case 0xb: // ENHANCE_YOUR_CALM
		return &Status{Code: CodeResourceExhausted, Message: msg}
	case 0xc: // INADEQUATE_SECURITY
		return &Status{Code: CodePermissionDenied, Message: msg}
	}
	return &Status{Code: CodeInternal, Message: msg}
}
