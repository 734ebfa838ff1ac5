package inspectv1

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// JSON renders m the way coordinoctl -o json and bug reports show it: every
// field present (zero values too, so scripts need no defaults), under its
// JSON (lowerCamelCase) name in declaration order, map keys sorted, and
// 64-bit integers as numbers rather than protojson's quoted strings. With
// an indent the document spans lines, indented by it per level; without,
// it is one line with no spaces. The output is the same for the same
// message, byte for byte (protojson varies its spacing on purpose), and
// protojson.Unmarshal reads it back.
//
// Integers above 2^53 (nanosecond times) are exact in the text; a reader
// that parses numbers as doubles rounds them.
func JSON(m proto.Message, indent string) ([]byte, error) {
	w := jsonWriter{indent: indent}
	if err := w.message(m.ProtoReflect(), 0); err != nil {
		return nil, err
	}
	return append(w.b.Bytes(), '\n'), nil
}

type jsonWriter struct {
	b      bytes.Buffer
	indent string
}

// newline starts a line at depth when indenting.
func (w *jsonWriter) newline(depth int) {
	if w.indent != "" {
		w.b.WriteByte('\n')
		w.b.WriteString(strings.Repeat(w.indent, depth))
	}
}

func (w *jsonWriter) key(k string) {
	w.str(k)
	w.b.WriteByte(':')
	if w.indent != "" {
		w.b.WriteByte(' ')
	}
}

func (w *jsonWriter) str(s string) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s) // a string always encodes
	w.b.Write(bytes.TrimSuffix(b.Bytes(), []byte("\n")))
}

func (w *jsonWriter) message(m protoreflect.Message, depth int) error {
	fields := m.Descriptor().Fields()
	if fields.Len() == 0 {
		w.b.WriteString("{}")
		return nil
	}
	w.b.WriteByte('{')
	for i := range fields.Len() {
		fd := fields.Get(i)
		if i > 0 {
			w.b.WriteByte(',')
		}
		w.newline(depth + 1)
		w.key(fd.JSONName())
		var err error
		switch {
		case fd.IsList():
			err = w.list(fd, m.Get(fd).List(), depth+1)
		case fd.IsMap():
			err = w.mapValue(fd, m.Get(fd).Map(), depth+1)
		case fd.Kind() == protoreflect.MessageKind || fd.Kind() == protoreflect.GroupKind:
			if !m.Has(fd) {
				w.b.WriteString("null")
				continue
			}
			err = w.message(m.Get(fd).Message(), depth+1)
		default:
			err = w.scalar(fd, m.Get(fd))
		}
		if err != nil {
			return fmt.Errorf("%s: %w", fd.FullName(), err)
		}
	}
	w.newline(depth)
	w.b.WriteByte('}')
	return nil
}

func (w *jsonWriter) list(fd protoreflect.FieldDescriptor, l protoreflect.List, depth int) error {
	if l.Len() == 0 {
		w.b.WriteString("[]")
		return nil
	}
	w.b.WriteByte('[')
	for i := range l.Len() {
		if i > 0 {
			w.b.WriteByte(',')
		}
		w.newline(depth + 1)
		var err error
		if fd.Kind() == protoreflect.MessageKind {
			err = w.message(l.Get(i).Message(), depth+1)
		} else {
			err = w.scalar(fd, l.Get(i))
		}
		if err != nil {
			return err
		}
	}
	w.newline(depth)
	w.b.WriteByte(']')
	return nil
}

func (w *jsonWriter) mapValue(fd protoreflect.FieldDescriptor, m protoreflect.Map, depth int) error {
	if m.Len() == 0 {
		w.b.WriteString("{}")
		return nil
	}
	keys := make([]protoreflect.MapKey, 0, m.Len())
	m.Range(func(k protoreflect.MapKey, _ protoreflect.Value) bool {
		keys = append(keys, k)
		return true
	})
	slices.SortFunc(keys, func(a, b protoreflect.MapKey) int { return strings.Compare(a.String(), b.String()) })
	vd := fd.MapValue()
	w.b.WriteByte('{')
	for i, k := range keys {
		if i > 0 {
			w.b.WriteByte(',')
		}
		w.newline(depth + 1)
		w.key(k.String())
		var err error
		if vd.Kind() == protoreflect.MessageKind {
			err = w.message(m.Get(k).Message(), depth+1)
		} else {
			err = w.scalar(vd, m.Get(k))
		}
		if err != nil {
			return err
		}
	}
	w.newline(depth)
	w.b.WriteByte('}')
	return nil
}

func (w *jsonWriter) scalar(fd protoreflect.FieldDescriptor, v protoreflect.Value) error {
	switch fd.Kind() {
	case protoreflect.BoolKind:
		w.b.WriteString(strconv.FormatBool(v.Bool()))
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind,
		protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		w.b.WriteString(strconv.FormatInt(v.Int(), 10))
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind, protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		w.b.WriteString(strconv.FormatUint(v.Uint(), 10))
	case protoreflect.FloatKind, protoreflect.DoubleKind:
		f := v.Float()
		switch {
		case math.IsNaN(f):
			w.str("NaN")
		case math.IsInf(f, 1):
			w.str("Infinity")
		case math.IsInf(f, -1):
			w.str("-Infinity")
		default:
			bits := 64
			if fd.Kind() == protoreflect.FloatKind {
				bits = 32
			}
			w.b.WriteString(strconv.FormatFloat(f, 'g', -1, bits))
		}
	case protoreflect.StringKind:
		w.str(v.String())
	case protoreflect.BytesKind:
		w.str(base64.StdEncoding.EncodeToString(v.Bytes()))
	case protoreflect.EnumKind:
		if ev := fd.Enum().Values().ByNumber(v.Enum()); ev != nil {
			w.str(string(ev.Name()))
		} else {
			w.b.WriteString(strconv.Itoa(int(v.Enum())))
		}
	default:
		return fmt.Errorf("unsupported kind %s", fd.Kind())
	}
	return nil
}
