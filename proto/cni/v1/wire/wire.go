package wire

import (
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/coordino/coordino/internal/schema"
)

// Request is a CNIRequest: one CNI invocation.
type Request struct {
	ContainerID string
	Netns       string
	IfName      string
	Args        string
	Path        string
	Stdin       []byte
}

// CNIError is a CNIError status detail.
type CNIError struct {
	Code    uint32
	Msg     string
	Details string
}

// Status is a google.rpc.Status.
type Status struct {
	Code    int32
	Message string
	// CNIError is the first detail of type CNIError, if any.
	CNIError *CNIError
}

// TypeURLCNIError is the type URL of a CNIError packed in a google.protobuf.Any.
const TypeURLCNIError = "type.googleapis.com/coordino.cni.v1.CNIError"

// Wire types.
const (
	typeVarint     = 0
	typeI64        = 1
	typeBytes      = 2
	typeStartGroup = 3
	typeEndGroup   = 4
	typeI32        = 5
)

// ErrMalformed marks input that is not a valid encoding of the message.
var ErrMalformed = errors.New("malformed protobuf message")

// ErrInvalidUTF8 marks a string field that is not valid UTF-8, which proto3
// forbids: the encoders refuse to write one and the decoders to read one,
// as the daemon's protobuf runtime does.
var ErrInvalidUTF8 = errors.New("not valid UTF-8")

// groupDepth is how deep unknown groups may nest, as protobuf's skipper
// allows (protowire.DefaultRecursionLimit).
const groupDepth = 10000

func appendVarint(b []byte, v uint64) []byte {
	for v >= 0x80 {
		b = append(b, byte(v)|0x80)
		v >>= 7
	}
	return append(b, byte(v))
}

func appendBytesField(b []byte, num int, v []byte) []byte {
	if len(v) == 0 {
		return b // proto3: empty is absent
	}
	b = appendVarint(b, uint64(num)<<3|typeBytes)
	b = appendVarint(b, uint64(len(v)))
	return append(b, v...)
}

func appendStringField(b []byte, num int, v string) []byte {
	if v == "" {
		return b
	}
	b = appendVarint(b, uint64(num)<<3|typeBytes)
	b = appendVarint(b, uint64(len(v)))
	return append(b, v...)
}

// requestStrings are CNIRequest's string fields, by field number.
func requestStrings(r *Request) [5]*string {
	return [5]*string{&r.ContainerID, &r.Netns, &r.IfName, &r.Args, &r.Path}
}

var requestFieldNames = [5]string{"container_id", "netns", "ifname", "args", "path"}

// AppendRequest appends r's encoding to b. A string field that is not
// valid UTF-8 is an error naming it (ErrInvalidUTF8).
func AppendRequest(b []byte, r *Request) ([]byte, error) {
	for i, s := range requestStrings(r) {
		if !utf8.ValidString(*s) {
			return b, fmt.Errorf("CNIRequest.%s: %w", requestFieldNames[i], ErrInvalidUTF8)
		}
		b = appendStringField(b, i+1, *s)
	}
	return appendBytesField(b, 6, r.Stdin), nil
}

// AppendQueuedDelete appends the encoding of a QueuedDelete of r queued at
// unixNano, stamped st (the zero Stamp writes none); errors are
// AppendRequest's.
func AppendQueuedDelete(b []byte, r *Request, unixNano int64, st schema.Stamp) ([]byte, error) {
	req, err := AppendRequest(nil, r)
	if err != nil {
		return b, fmt.Errorf("QueuedDelete.request: %w", err)
	}
	b = appendVarint(b, 1<<3|typeBytes)
	b = appendVarint(b, uint64(len(req)))
	b = append(b, req...)
	if unixNano != 0 {
		b = appendVarint(b, 2<<3|typeVarint)
		b = appendVarint(b, uint64(unixNano))
	}
	if st.Version != 0 {
		b = appendVarint(b, 3<<3|typeVarint)
		b = appendVarint(b, uint64(st.Version))
	}
	if st.MinReader != 0 {
		b = appendVarint(b, 4<<3|typeVarint)
		b = appendVarint(b, uint64(st.MinReader))
	}
	return b, nil
}

// field is one decoded field: a varint value or a length-delimited payload.
type field struct {
	num    int
	typ    int
	varint uint64
	bytes  []byte
}

func consumeVarint(b []byte) (uint64, int, error) {
	var v uint64
	for i := 0; i < len(b) && i < 10; i++ {
		c := b[i]
		if i == 9 && c > 1 {
			return 0, 0, ErrMalformed
		}
		v |= uint64(c&0x7f) << (7 * i)
		if c < 0x80 {
			return v, i + 1, nil
		}
	}
	return 0, 0, ErrMalformed
}

// fields walks b's fields, calling f for each. As in protobuf, a field f
// does not know, or whose wire type is not the one its number has in the
// schema, is skipped as unknown (f ignores it), groups included; the
// skipped bytes must still be well formed.
func fields(b []byte, f func(field) error) error {
	for len(b) > 0 {
		tag, n, err := consumeVarint(b)
		if err != nil {
			return err
		}
		b = b[n:]
		fl := field{num: int(tag >> 3), typ: int(tag & 7)}
		if tag>>3 < 1 || tag>>3 > 1<<29-1 {
			return ErrMalformed
		}
		if n, err = fl.consume(b, groupDepth); err != nil {
			return err
		}
		b = b[n:]
		if err := f(fl); err != nil {
			return err
		}
	}
	return nil
}

// consume reads fl's value from b and returns its length.
func (fl *field) consume(b []byte, depth int) (int, error) {
	n := 0
	switch fl.typ {
	case typeVarint:
		v, m, err := consumeVarint(b)
		if err != nil {
			return 0, err
		}
		fl.varint, n = v, m
	case typeI64:
		n = 8
	case typeI32:
		n = 4
	case typeBytes:
		l, m, err := consumeVarint(b)
		if err != nil || l > uint64(len(b)-m) {
			return 0, ErrMalformed
		}
		fl.bytes = b[m : m+int(l)]
		n = m + int(l)
	case typeStartGroup:
		return skipGroup(fl.num, b, depth)
	default: // an end group without its start, or a reserved wire type
		return 0, ErrMalformed
	}
	if n > len(b) {
		return 0, ErrMalformed
	}
	return n, nil
}

// skipGroup returns the length of the group num's contents and its end.
// Field numbers inside are checked as protobuf's skipper checks them
// (positive, at most 2^31-1).
func skipGroup(num int, b []byte, depth int) (int, error) {
	if depth < 0 {
		return 0, fmt.Errorf("%w: groups nested deeper than %d", ErrMalformed, groupDepth)
	}
	start := len(b)
	for {
		tag, n, err := consumeVarint(b)
		if err != nil {
			return 0, err
		}
		b = b[n:]
		if tag>>3 < 1 || tag>>3 > 1<<31-1 {
			return 0, ErrMalformed
		}
		inner := field{num: int(tag >> 3), typ: int(tag & 7)}
		if inner.typ == typeEndGroup {
			if inner.num != num {
				return 0, ErrMalformed
			}
			return start - len(b), nil
		}
		if n, err = inner.consume(b, depth-1); err != nil {
			return 0, err
		}
		b = b[n:]
	}
}

// str is a string field's value; msg.name names it in the error.
func (f field) str(msg, name string) (string, error) {
	if !utf8.Valid(f.bytes) {
		return "", fmt.Errorf("%w: %s.%s: %w", ErrMalformed, msg, name, ErrInvalidUTF8)
	}
	return string(f.bytes), nil
}

// DecodeRequest decodes a CNIRequest.
func DecodeRequest(b []byte) (*Request, error) {
	r := &Request{}
	return r, decodeRequestInto(r, b)
}

// decodeRequestInto decodes b into r, over what r holds: a message field
// that occurs more than once is merged, as protobuf merges it.
func decodeRequestInto(r *Request, b []byte) error {
	strs := requestStrings(r)
	return fields(b, func(f field) error {
		if f.num < 1 || f.num > 6 || f.typ != typeBytes {
			return nil
		}
		if f.num == 6 {
			r.Stdin = append([]byte(nil), f.bytes...)
			return nil
		}
		s, err := f.str("CNIRequest", requestFieldNames[f.num-1])
		*strs[f.num-1] = s
		return err
	})
}

// DecodeQueuedDelete decodes a QueuedDelete; the request is nil when absent,
// the stamp zero when the record has none.
func DecodeQueuedDelete(b []byte) (req *Request, unixNano int64, st schema.Stamp, err error) {
	err = fields(b, func(f field) error {
		switch {
		case f.num == 1 && f.typ == typeBytes:
			if req == nil {
				req = &Request{}
			}
			return decodeRequestInto(req, f.bytes)
		case f.num == 2 && f.typ == typeVarint:
			unixNano = int64(f.varint)
		case f.num == 3 && f.typ == typeVarint:
			st.Version = uint32(f.varint)
		case f.num == 4 && f.typ == typeVarint:
			st.MinReader = uint32(f.varint)
		}
		return nil
	})
	return req, unixNano, st, err
}

// DecodeResponse returns a CNIResponse's result.
func DecodeResponse(b []byte) ([]byte, error) {
	var result []byte
	err := fields(b, func(f field) error {
		if f.num == 1 && f.typ == typeBytes {
			result = f.bytes
		}
		return nil
	})
	return result, err
}

// DecodeStatus decodes a google.rpc.Status and the first CNIError among its
// details. Every detail must be a well-formed google.protobuf.Any, as for
// protobuf; only the CNIError's value is decoded.
func DecodeStatus(b []byte) (*Status, error) {
	st := &Status{}
	err := fields(b, func(f field) error {
		switch {
		case f.num == 1 && f.typ == typeVarint:
			st.Code = int32(f.varint)
		case f.num == 2 && f.typ == typeBytes:
			var err error
			st.Message, err = f.str("google.rpc.Status", "message")
			return err
		case f.num == 3 && f.typ == typeBytes:
			typeURL, value, err := decodeAny(f.bytes)
			if err != nil || typeURL != TypeURLCNIError || st.CNIError != nil {
				return err
			}
			st.CNIError, err = decodeCNIError(value)
			return err
		}
		return nil
	})
	return st, err
}

// decodeAny decodes a google.protobuf.Any.
func decodeAny(b []byte) (typeURL string, value []byte, err error) {
	err = fields(b, func(f field) error {
		switch {
		case f.num == 1 && f.typ == typeBytes:
			var err error
			typeURL, err = f.str("google.protobuf.Any", "type_url")
			return err
		case f.num == 2 && f.typ == typeBytes:
			value = f.bytes
		}
		return nil
	})
	return typeURL, value, err
}

func decodeCNIError(b []byte) (*CNIError, error) {
	ce := &CNIError{}
	err := fields(b, func(f field) error {
		var err error
		switch {
		case f.num == 1 && f.typ == typeVarint:
			ce.Code = uint32(f.varint)
		case f.num == 2 && f.typ == typeBytes:
			ce.Msg, err = f.str("CNIError", "msg")
		case f.num == 3 && f.typ == typeBytes:
			ce.Details, err = f.str("CNIError", "details")
		}
		return err
	})
	return ce, err
}
