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
	framePriority     = 0x2
	frameRSTStream    = 0x3
	frameSettings     = 0x4
	framePushPromise  = 0x5
	framePing         = 0x6
	frameGoAway       = 0x7
	frameWindowUpdate = 0x8
	frameContinuation = 0x9

	flagEndStream  = 0x1
	flagAck        = 0x1
	flagEndHeaders = 0x4
	flagPadded     = 0x8
	flagPriority   = 0x20

	settingEnablePush        = 0x2
	settingInitialWindowSize = 0x4
	settingMaxFrameSize      = 0x5
	settingMaxHeaderListSize = 0x6
	settingConnectProtocol   = 0x8 // RFC 8441
	settingNoRFC7540Priority = 0x9 // RFC 9218

	defaultWindow       = 65535
	maxWindow           = 1<<31 - 1
	defaultMaxFrameSize = 16384 // also the largest frame the client accepts: it advertises no other
	maxFrameSizeLimit   = 1<<24 - 1
	maxMessage          = 64 << 20
	// maxHeaderBlock bounds a response header block, CONTINUATIONs included,
	// and is advertised as SETTINGS_MAX_HEADER_LIST_SIZE: a server that
	// keeps to it sends less (the limit counts each field's name, value and
	// 32 bytes, more than its encoding takes), so only a broken or hostile
	// one reaches it.
	maxHeaderBlock = 1 << 20
	streamID       = 1
)

// HTTP/2 error codes (RFC 9113 §7) the client sends or acts on.
const (
	errCodeProtocol           = 0x1
	errCodeFlowControl        = 0x3
	errCodeFrameSize          = 0x6
	errCodeRefused            = 0x7
	errCodeCancel             = 0x8
	errCodeCompression        = 0x9
	errCodeEnhanceCalm        = 0xb
	errCodeInadequateSecurity = 0xc
)

// errCodeNames is indexed by error code (an array: nothing to build at
// the plugin's start).
var errCodeNames = [...]string{"NO_ERROR", "PROTOCOL_ERROR", "INTERNAL_ERROR", "FLOW_CONTROL_ERROR", "SETTINGS_TIMEOUT",
	"STREAM_CLOSED", "FRAME_SIZE_ERROR", "REFUSED_STREAM", "CANCEL", "COMPRESSION_ERROR", "CONNECT_ERROR",
	"ENHANCE_YOUR_CALM", "INADEQUATE_SECURITY", "HTTP_1_1_REQUIRED"}

func errCodeName(code uint32) string {
	if code < uint32(len(errCodeNames)) {
		return errCodeNames[code]
	}
	return fmt.Sprintf("error code 0x%x", code)
}

// protocolError is a connection error (RFC 9113 §5.4.1): the server broke
// the protocol, so the connection is unusable. The call ends at once, tells
// the server why in a GOAWAY, and reports it as Unavailable, as gRPC
// clients report a connection that failed.
type protocolError struct {
	code uint32
	msg  string
}

func (e *protocolError) Error() string {
	return "HTTP/2 " + errCodeName(e.code) + " from the server: " + e.msg
}

func protoErr(code uint32, format string, args ...any) error {
	return &protocolError{code: code, msg: fmt.Sprintf(format, args...)}
}

var frameNames = [...]string{"DATA", "HEADERS", "PRIORITY", "RST_STREAM", "SETTINGS", "PUSH_PROMISE", "PING", "GOAWAY", "WINDOW_UPDATE", "CONTINUATION"}

const preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// clientSettings is the client's SETTINGS: no server push, and the header
// block limit.
var clientSettings = binary.BigEndian.AppendUint32([]byte{
	0, settingEnablePush, 0, 0, 0, 0,
	0, settingMaxHeaderListSize}, maxHeaderBlock)

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
	c := &call{conn: conn, r: bufio.NewReaderSize(conn, 16<<10), sendWindow: defaultWindow, connWindow: defaultWindow,
		initialWindow: defaultWindow, maxFrame: defaultMaxFrameSize}
	resp, err := c.run(ctx, method, md, req)
	if err == nil {
		return resp, nil
	}
	var st *Status
	if errors.As(err, &st) {
		return nil, st
	}
	var pe *protocolError
	if errors.As(err, &pe) {
		// Best effort: the server learns why the client hangs up.
		c.out = c.out[:0]
		c.frame(frameGoAway, 0, 0, binary.BigEndian.AppendUint32([]byte{0, 0, 0, 0}, pe.code))
		_ = c.flush()
	}
	if ctx.Err() != nil || timedOut(err) {
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
	// Send windows: the stream's and the connection's (RFC 9113 §6.9), and
	// the server's SETTINGS_INITIAL_WINDOW_SIZE the stream's started from.
	sendWindow, connWindow, initialWindow int64
	maxFrame                              int
	sawSettings                           bool // the server's preface
	hdr                                   [9]byte
	buf                                   []byte // the frame being read
	out                                   []byte
	// writeErr is the first failed write; the call writes nothing after it.
	writeErr error
}

func (c *call) frame(typ, flags byte, stream uint32, payload []byte) {
	n := len(payload)
	c.out = append(c.out, byte(n>>16), byte(n>>8), byte(n), typ, flags)
	c.out = binary.BigEndian.AppendUint32(c.out, stream)
	c.out = append(c.out, payload...)
}

// flush writes the queued frames. A failed write does not end the call: a
// server may answer and close at once (a grpc-go server stopped right after
// a call's trailers does), and then its whole answer is in the socket while
// every write of the client's SETTINGS ACK or WINDOW_UPDATE fails. The call
// goes on reading to the end of the stream, and the write error counts only
// if the stream does not complete (failed). A write that timed out is the
// exception: the call's time is up, and it ends with that error.
func (c *call) flush() error {
	if c.writeErr == nil && len(c.out) > 0 {
		if _, err := c.conn.Write(c.out); err != nil {
			c.writeErr = fmt.Errorf("write: %w", err)
			if timedOut(err) {
				return c.writeErr
			}
		}
	}
	c.out = c.out[:0]
	return nil
}

func timedOut(err error) bool {
	return errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, syscall.EAGAIN)
}

// failed is the call's error when reading the stream failed with err.
func (c *call) failed(err error) error {
	var pe *protocolError
	if c.writeErr == nil || errors.As(err, &pe) {
		return err
	}
	return fmt.Errorf("%w, after %v", err, c.writeErr)
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
	c.frame(frameSettings, 0, 0, clientSettings)

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
	// Once a write failed the request cannot be finished, but the server
	// may have answered already (an error, say): read what it sent.
	for sent := 0; sent < len(body) && c.writeErr == nil; {
		n := min(int64(len(body)-sent), c.sendWindow, c.connWindow, int64(c.maxFrame))
		if n <= 0 {
			// Out of window: read until the server grants more.
			if err := c.flush(); err != nil {
				return nil, err
			}
			if err := c.readFrame(&resp); err != nil {
				return nil, c.failed(err)
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
			return nil, c.failed(err)
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

// readFrame reads and acts on one frame. Every violation of RFC 9113 it
// can see is a connection error: the call has one stream, so nothing is
// saved by keeping the connection.
func (c *call) readFrame(resp *response) error {
	if _, err := io.ReadFull(c.r, c.hdr[:]); err != nil {
		return fmt.Errorf("read frame: %w", err)
	}
	length := int(c.hdr[0])<<16 | int(c.hdr[1])<<8 | int(c.hdr[2])
	typ, flags := c.hdr[3], c.hdr[4]
	stream := binary.BigEndian.Uint32(c.hdr[5:]) & 0x7fffffff
	name := "unknown frame" // named only in errors
	if int(typ) < len(frameNames) {
		name = frameNames[typ]
	}
	if length > defaultMaxFrameSize {
		return protoErr(errCodeFrameSize, "%s (type 0x%x) of %d bytes exceeds the maximum frame size of %d", name, typ, length, defaultMaxFrameSize)
	}
	if cap(c.buf) < length {
		c.buf = make([]byte, length, max(length, 512))
	}
	payload := c.buf[:length]
	if _, err := io.ReadFull(c.r, payload); err != nil {
		return fmt.Errorf("read frame: %w", err)
	}
	if !c.sawSettings {
		if typ != frameSettings || flags&flagAck != 0 {
			return protoErr(errCodeProtocol, "%s as its first frame, not SETTINGS", name)
		}
		c.sawSettings = true
	}
	if resp.block != nil && (typ != frameContinuation || stream != streamID) {
		return protoErr(errCodeProtocol, "%s on stream %d inside the header block of stream %d", name, stream, streamID)
	}
	// Where each frame may be: connection frames on stream 0, stream frames
	// on the call's stream only (every other stream is idle: the client
	// opens one and refuses push). PRIORITY may name any stream; unknown
	// types are ignored (§5.5).
	switch typ {
	case frameSettings, framePing, frameGoAway:
		if stream != 0 {
			return protoErr(errCodeProtocol, "%s on stream %d", name, stream)
		}
	case framePriority:
		if stream == 0 {
			return protoErr(errCodeProtocol, "PRIORITY on stream 0")
		}
		if length != 5 {
			return protoErr(errCodeFrameSize, "PRIORITY of %d bytes", length)
		}
		return nil
	case framePushPromise:
		return protoErr(errCodeProtocol, "PUSH_PROMISE on stream %d, though the client disabled push", stream)
	case frameData, frameHeaders, frameRSTStream, frameContinuation, frameWindowUpdate:
		if stream == 0 && typ != frameWindowUpdate {
			return protoErr(errCodeProtocol, "%s on stream 0", name)
		}
		if stream != 0 && stream != streamID {
			return protoErr(errCodeProtocol, "%s on stream %d, which the client never opened", name, stream)
		}
	default:
		return nil
	}
	switch typ {
	case frameSettings:
		if flags&flagAck != 0 {
			if length != 0 {
				return protoErr(errCodeFrameSize, "SETTINGS ACK with %d bytes of payload", length)
			}
			return nil
		}
		if length%6 != 0 {
			return protoErr(errCodeFrameSize, "SETTINGS of %d bytes, not a multiple of 6", length)
		}
		for p := payload; len(p) >= 6; p = p[6:] {
			if err := c.setting(binary.BigEndian.Uint16(p), int64(binary.BigEndian.Uint32(p[2:]))); err != nil {
				return err
			}
		}
		c.frame(frameSettings, flagAck, 0, nil)
		return c.flush()
	case framePing:
		if length != 8 {
			return protoErr(errCodeFrameSize, "PING of %d bytes", length)
		}
		if flags&flagAck == 0 {
			c.frame(framePing, flagAck, 0, payload)
			return c.flush()
		}
	case frameWindowUpdate:
		if length != 4 {
			return protoErr(errCodeFrameSize, "WINDOW_UPDATE of %d bytes", length)
		}
		inc := int64(binary.BigEndian.Uint32(payload) & 0x7fffffff)
		if inc == 0 {
			return protoErr(errCodeProtocol, "WINDOW_UPDATE of 0 on stream %d", stream)
		}
		w := &c.sendWindow
		if stream == 0 {
			w = &c.connWindow
		}
		if *w+inc > maxWindow {
			return protoErr(errCodeFlowControl, "WINDOW_UPDATE of %d on stream %d takes the window past 2^31-1", inc, stream)
		}
		*w += inc
	case frameGoAway:
		if length < 8 {
			return protoErr(errCodeFrameSize, "GOAWAY of %d bytes", length)
		}
		if binary.BigEndian.Uint32(payload)&0x7fffffff < streamID {
			return fmt.Errorf("server sent GOAWAY (%s, %q) before serving the call", errCodeName(binary.BigEndian.Uint32(payload[4:])), payload[8:])
		}
	case frameRSTStream:
		if length != 4 {
			return protoErr(errCodeFrameSize, "RST_STREAM of %d bytes", length)
		}
		return rstStatus(binary.BigEndian.Uint32(payload))
	case frameData:
		if !resp.sawHeaders {
			return protoErr(errCodeProtocol, "DATA before the response headers")
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
		block, err := unpad(flags, payload)
		if err != nil {
			return err
		}
		if flags&flagPriority != 0 {
			if len(block) < 5 {
				return protoErr(errCodeFrameSize, "HEADERS too short for its priority")
			}
			block = block[5:]
		}
		resp.blockEnd = flags&flagEndStream != 0
		if flags&flagEndHeaders == 0 {
			resp.block = append(make([]byte, 0, 2*len(block)), block...)
			return nil
		}
		return resp.headers(block)
	case frameContinuation:
		if resp.block == nil {
			return protoErr(errCodeProtocol, "CONTINUATION without HEADERS")
		}
		if len(resp.block)+len(payload) > maxHeaderBlock {
			return protoErr(errCodeProtocol, "header block exceeds %d bytes", maxHeaderBlock)
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

// setting applies one of the server's settings (RFC 9113 §6.5.2); a value
// out of its range is a connection error.
func (c *call) setting(id uint16, v int64) error {
	switch id {
	case settingEnablePush:
		if v != 0 { // a server may not enable push
			return protoErr(errCodeProtocol, "SETTINGS_ENABLE_PUSH %d", v)
		}
	case settingConnectProtocol, settingNoRFC7540Priority:
		if v > 1 {
			return protoErr(errCodeProtocol, "setting 0x%x of %d, not 0 or 1", id, v)
		}
	case settingInitialWindowSize:
		if v > maxWindow {
			return protoErr(errCodeFlowControl, "SETTINGS_INITIAL_WINDOW_SIZE %d exceeds 2^31-1", v)
		}
		// The open stream's window moves by the change (§6.9.2); it may
		// go negative.
		c.sendWindow += v - c.initialWindow
		c.initialWindow = v
		if c.sendWindow > maxWindow {
			return protoErr(errCodeFlowControl, "SETTINGS_INITIAL_WINDOW_SIZE %d takes the stream window past 2^31-1", v)
		}
	case settingMaxFrameSize:
		if v < defaultMaxFrameSize || v > maxFrameSizeLimit {
			return protoErr(errCodeProtocol, "SETTINGS_MAX_FRAME_SIZE %d outside %d..%d", v, defaultMaxFrameSize, maxFrameSizeLimit)
		}
		c.maxFrame = int(v)
	}
	return nil
}

func unpad(flags byte, p []byte) ([]byte, error) {
	if flags&flagPadded == 0 {
		return p, nil
	}
	if len(p) < 1 {
		return nil, protoErr(errCodeProtocol, "padded frame without its pad length")
	}
	if int(p[0]) > len(p)-1 {
		return nil, protoErr(errCodeProtocol, "padding of %d bytes in a frame of %d", p[0], len(p))
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
		return protoErr(errCodeCompression, "header block: %v", err)
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
	msg := "stream reset by server with " + errCodeName(code)
	switch code {
	case errCodeRefused:
		return &Status{Code: CodeUnavailable, Message: msg}
	case errCodeCancel: // this client never cancels, so the server's deadline (grpc-timeout) expired
		return &Status{Code: CodeDeadlineExceeded, Message: msg}
	case errCodeEnhanceCalm:
		return &Status{Code: CodeResourceExhausted, Message: msg}
	case errCodeInadequateSecurity:
		return &Status{Code: CodePermissionDenied, Message: msg}
	}
	return &Status{Code: CodeInternal, Message: msg}
}
