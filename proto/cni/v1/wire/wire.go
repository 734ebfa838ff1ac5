package wire

import (
	"errors"
	"fmt"
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
	typeVarint = 0
	typeI64    = 1
	typeBytes  = 2
	typeI32    = 5
)

// ErrMalformed marks input that is not a valid encoding of the message.
var ErrMalformed = errors.New("malformed protobuf message")

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

// AppendRequest appends r's encoding to b.
func AppendRequest(b []byte, r *Request) []byte {
	b = appendStringField(b, 1, r.ContainerID)
	b = appendStringField(b, 2, r.Netns)
	b = appendStringField(b, 3, r.IfName)
	b = appendStringField(b, 4, r.Args)
	b = appendStringField(b, 5, r.Path)
	return appendBytesField(b, 6, r.Stdin)
}

// AppendQueuedDelete appends the encoding of a QueuedDelete of r queued at unixNano.
func AppendQueuedDelete(b []byte, r *Request, unixNano int64) []byte {
	b = appendVarint(b, 1<<3|typeBytes)
	b = appendVarint(b, uint64(len(AppendRequest(nil, r))))
	b = AppendRequest(b, r)
	if unixNano != 0 {
		b = appendVarint(b, 2<<3|typeVarint)
		b = appendVarint(b, uint64(unixNano))
	}
	return b
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

// fields walks b's fields, calling f for each; unknown fields are f's to skip.
func fields(b []byte, f func(field) error) error {
	for len(b) > 0 {
		tag, n, err := consumeVarint(b)
		if err != nil {
			return err
		}
		b = b[n:]
		fl := field{num: int(tag >> 3), typ: int(tag & 7)}
		if fl.num < 1 || fl.num > 1<<29-1 {
			return ErrMalformed
		}
		switch fl.typ {
		case typeVarint:
			if fl.varint, n, err = consumeVarint(b); err != nil {
				return err
			}
		case typeI64:
			n = 8
		case typeI32:
			n = 4
		case typeBytes:
			l, m, err := consumeVarint(b)
			if err != nil || l > uint64(len(b)-m) {
				return ErrMalformed
			}
			fl.bytes = b[m : m+int(l)]
			n = m + int(l)
		default:
			return ErrMalformed
		}
		if n > len(b) {
			return ErrMalformed
		}
		b = b[n:]
		if err := f(fl); err != nil {
			return err
		}
	}
	return nil
}

// want checks a known field's wire type.
func (f field) want(typ int) error {
	if f.typ != typ {
		return fmt.Errorf("%w: field %d has wire type %d, want %d", ErrMalformed, f.num, f.typ, typ)
	}
	return nil
}

// DecodeRequest decodes a CNIRequest.
func DecodeRequest(b []byte) (*Request, error) {
	r := &Request{}
	err := fields(b, func(f field) error {
		if f.num < 1 || f.num > 6 {
			return nil
		}
		if err := f.want(typeBytes); err != nil {
			return err
		}
		switch f.num {
		case 1:
			r.ContainerID = string(f.bytes)
		case 2:
			r.Netns = string(f.bytes)
		case 3:
			r.IfName = string(f.bytes)
		case 4:
			r.Args = string(f.bytes)
		case 5:
			r.Path = string(f.bytes)
		case 6:
			r.Stdin = append([]byte(nil), f.bytes...)
		}
		return nil
	})
	return r, err
}

// DecodeQueuedDelete decodes a QueuedDelete; the request is nil when absent.
func DecodeQueuedDelete(b []byte) (req *Request, unixNano int64, err error) {
	err = fields(b, func(f field) error {
		switch f.num {
		case 1:
			if err := f.want(typeBytes); err != nil {
				return err
			}
			r, err := DecodeRequest(f.bytes)
			req = r
			return err
		case 2:
			if err := f.want(typeVarint); err != nil {
				return err
			}
			unixNano = int64(f.varint)
		}
		return nil
	})
	return req, unixNano, err
}

// DecodeResponse returns a CNIResponse's result.
func DecodeResponse(b []byte) ([]byte, error) {
	var result []byte
	err := fields(b, func(f field) error {
		if f.num != 1 {
			return nil
		}
		if err := f.want(typeBytes); err != nil {
			return err
		}
		result = f.bytes
		return nil
	})
	return result, err
}

// DecodeStatus decodes a google.rpc.Status and the first CNIError among its details.
func DecodeStatus(b []byte) (*Status, error) {
	st := &Status{}
	err := fields(b, func(f field) error {
		switch f.num {
		case 1:
			if err := f.want(typeVarint); err != nil {
				return err
			}
			st.Code = int32(f.varint)
		case 2:
			if err := f.want(typeBytes); err != nil {
				return err
			}
			st.Message = string(f.bytes)
		case 3:
			if err := f.want(typeBytes); err != nil {
				return err
			}
			if st.CNIError != nil {
				return nil
			}
			ce, err := decodeAnyCNIError(f.bytes)
			st.CNIError = ce
			return err
		}
		return nil
	})
	return st, err
}

// decodeAnyCNIError decodes a google.protobuf.Any; it is nil unless it packs a CNIError.
func decodeAnyCNIError(b []byte) (*CNIError, error) {
	var typeURL string
	var value []byte
	if err := fields(b, func(f field) error {
		if f.num != 1 && f.num != 2 {
			return nil
		}
		if err := f.want(typeBytes); err != nil {
			return err
		}
		if f.num == 1 {
			typeURL = string(f.bytes)
		} else {
			value = f.bytes
		}
		return nil
	}); err != nil {
		return nil, err
	}
	if typeURL != TypeURLCNIError {
		return nil, nil
	}
	ce := &CNIError{}
	err := fields(value, func(f field) error {
		switch f.num {
		case 1:
			if err := f.want(typeVarint); err != nil {
				return err
			}
			ce.Code = uint32(f.varint)
		case 2, 3:
			if err := f.want(typeBytes); err != nil {
				return err
			}
			if f.num == 2 {
				ce.Msg = string(f.bytes)
			} else {
				ce.Details = string(f.bytes)
			}
		}
		return nil
	})
	return ce, err
}
