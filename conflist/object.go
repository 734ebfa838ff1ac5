package conflist

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"unicode/utf8"
)

// member is one key of a JSON object with its value kept as raw JSON text.
type member struct {
	key    string
	rawKey []byte // the key's JSON text as read (escapes kept); nil for new keys
	val    json.RawMessage
}

// object is a JSON object that remembers the order of its keys, so that
// writing it back changes nothing but whitespace.
type object []member

func (o object) get(key string) (json.RawMessage, bool) {
	for _, m := range o {
		if m.key == key {
			return m.val, true
		}
	}
	return nil, false
}

func (o object) has(key string) bool {
	_, ok := o.get(key)
	return ok
}

// set replaces key's value where it stands, or appends key at the end.
func (o object) set(key string, val json.RawMessage) object {
	for i := range o {
		if o[i].key == key {
			o[i].val = val
			return o
		}
	}
	return append(o, member{key: key, val: val})
}

func (o object) del(key string) object {
	out := o[:0:0]
	for _, m := range o {
		if m.key != key {
			out = append(out, m)
		}
	}
	return out
}

func (o object) clone() object {
	return append(object(nil), o...)
}

// stringField returns key's value when it is a JSON string.
func (o object) stringField(key string) (s string, present bool, err error) {
	raw, ok := o.get(key)
	if !ok {
		return "", false, nil
	}
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", true, fmt.Errorf("%s: must be a string, got %s", key, kindOf(raw))
	}
	return s, true, nil
}

// parseObject reads exactly one JSON object from data, keeping key order and
// raw values. Duplicate keys are refused: encoding/json (and so every CNI
// runtime) silently keeps the last one, and an editor must not guess.
func parseObject(data []byte) (object, error) {
	if !utf8.Valid(data) { // RFC 8259; encoding/json would silently alter such text
		return nil, errors.New("invalid JSON: not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	tok, err := dec.Token()
	if err != nil {
		return nil, fmt.Errorf("invalid JSON: %w", err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, fmt.Errorf("must be a JSON object, got %s", kindOfToken(tok))
	}
	var o object
	seen := map[string]bool{}
	for dec.More() {
		start := dec.InputOffset()
		tok, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("invalid JSON: %w", err)
		}
		key, ok := tok.(string)
		if !ok {
			return nil, fmt.Errorf("invalid JSON: object key is not a string")
		}
		// Only whitespace and a comma can precede the key's opening quote.
		rawKey := bytes.TrimLeft(data[start:dec.InputOffset()], " \t\r\n,")
		var val json.RawMessage
		if err := dec.Decode(&val); err != nil {
			return nil, fmt.Errorf("%s: invalid JSON: %w", key, err)
		}
		if seen[key] {
			return nil, fmt.Errorf("%s: duplicate key", key)
		}
		seen[key] = true
		o = append(o, member{key: key, rawKey: rawKey, val: val})
	}
	if _, err := dec.Token(); err != nil {
		return nil, fmt.Errorf("invalid JSON: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("invalid JSON: trailing data after the object")
	}
	return o, nil
}

// parseArray splits a raw JSON array into its raw elements.
func parseArray(raw json.RawMessage) ([]json.RawMessage, error) {
	var elems []json.RawMessage
	if err := json.Unmarshal(raw, &elems); err != nil || elems == nil { // "null" leaves elems nil
		return nil, fmt.Errorf("must be an array, got %s", kindOf(raw))
	}
	return elems, nil
}

// encode writes o as compact JSON; values are copied as they are.
func (o object) encode(buf *bytes.Buffer) {
	buf.WriteByte('{')
	for i, m := range o {
		if i > 0 {
			buf.WriteByte(',')
		}
		if m.rawKey != nil {
			buf.Write(m.rawKey)
		} else {
			writeString(buf, m.key)
		}
		buf.WriteByte(':')
		buf.Write(m.val)
	}
	buf.WriteByte('}')
}

func (o object) compact() json.RawMessage {
	var buf bytes.Buffer
	o.encode(&buf)
	return buf.Bytes()
}

func writeString(buf *bytes.Buffer, s string) {
	enc := json.NewEncoder(buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s)           // a Go string always encodes
	buf.Truncate(buf.Len() - 1) // Encode appends a newline
}

// pretty indents compact JSON the way CNI configs are usually written. Indent
// only touches whitespace between tokens, so values keep their exact text.
func pretty(compact []byte) ([]byte, error) {
	var out bytes.Buffer
	if err := json.Indent(&out, compact, "", "  "); err != nil {
		return nil, err
	}
	out.WriteByte('\n')
	return out.Bytes(), nil
}

func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("conflist: marshal %T: %v", v, err)) // only called on plain strings and ints
	}
	return b
}

func kindOf(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return "nothing"
	}
	switch raw[0] {
	case '{':
		return "an object"
	case '[':
		return "an array"
	case '"':
		return "a string"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	default:
		return "a number"
	}
}

func kindOfToken(tok json.Token) string {
	switch t := tok.(type) {
	case json.Delim:
		if t == '[' {
			return "an array"
		}
		return string(t)
	case string:
		return "a string"
	case bool:
		return "a boolean"
	case nil:
		return "null"
	default:
		return "a number"
	}
}
