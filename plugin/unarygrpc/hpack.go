package unarygrpc

import (
	"errors"
	"strings"
)

// HPACK (RFC 7541), only as much as one call needs. Requests are encoded as
// literals without indexing and with plain strings, which every decoder
// takes. Responses are decoded fully: grpc-go indexes and Huffman-codes its
// response headers and trailers. A general HPACK library costs the plugin
// process about 8% of its CPU per exec (static tables built at start-up, a
// Huffman tree built on the first decode); the canonical Huffman code below
// decodes from its code lengths alone.

// appendHeaderField appends name: value as a literal without indexing with a
// new name (RFC 7541 §6.2.2).
func appendHeaderField(dst []byte, name, value string) []byte {
	dst = append(dst, 0)
	dst = appendHpackString(dst, name)
	return appendHpackString(dst, value)
}

func appendHpackString(dst []byte, s string) []byte {
	dst = appendHpackInt(dst, 7, 0, uint64(len(s)))
	return append(dst, s...)
}

// appendHpackInt appends i with an n-bit prefix whose other bits are first (§5.1).
func appendHpackInt(dst []byte, n uint, first byte, i uint64) []byte {
	limit := uint64(1)<<n - 1
	if i < limit {
		return append(dst, first|byte(i))
	}
	dst = append(dst, first|byte(limit))
	for i -= limit; i >= 0x80; i >>= 7 {
		dst = append(dst, byte(i)|0x80)
	}
	return append(dst, byte(i))
}

// headerTableSize is the decoder's dynamic table limit: SETTINGS_HEADER_TABLE_SIZE,
// which the call leaves at its default.
const headerTableSize = 4096

var (
	errHpack = errors.New("malformed header block")
	// errLateSizeUpdate: dynamic table size updates may only start a
	// block, and there are at most two (RFC 7541 §4.2).
	errLateSizeUpdate = errors.New("dynamic table size update after a header field, or a third one")
)

type headerField struct{ name, value string }

// hpackDecoder holds a connection's dynamic table, newest entry first.
type hpackDecoder struct {
	dynamic  []headerField
	size     int
	capacity int
}

func newHpackDecoder() *hpackDecoder { return &hpackDecoder{capacity: headerTableSize} }

// decode calls emit for each field of one complete header block.
func (d *hpackDecoder) decode(block []byte, emit func(name, value string)) error {
	updates := 0 // size updates at the start of the block; -1 after a field
	for p := block; len(p) > 0; {
		b := p[0]
		switch {
		case b&0x80 != 0: // indexed field (§6.1)
			idx, rest, err := hpackInt(p, 7)
			if err != nil {
				return err
			}
			f, err := d.field(idx)
			if err != nil {
				return err
			}
			emit(f.name, f.value)
			p, updates = rest, -1
		case b&0xe0 == 0x20: // dynamic table size update (§6.3)
			if updates < 0 || updates == 2 {
				return errLateSizeUpdate
			}
			updates++
			size, rest, err := hpackInt(p, 5)
			if err != nil {
				return err
			}
			if size > headerTableSize {
				return errHpack
			}
			d.capacity = int(size)
			d.evict(0)
			p = rest
		default: // literals: with incremental indexing (§6.2.1), without or never indexed (§6.2.2, §6.2.3)
			indexed := b&0xc0 == 0x40
			prefix := uint(4)
			if indexed {
				prefix = 6
			}
			idx, rest, err := hpackInt(p, prefix)
			if err != nil {
				return err
			}
			var f headerField
			if idx == 0 {
				if f.name, rest, err = hpackString(rest); err != nil {
					return err
				}
			} else {
				named, err := d.field(idx)
				if err != nil {
					return err
				}
				f.name = named.name
			}
			if f.value, rest, err = hpackString(rest); err != nil {
				return err
			}
			emit(f.name, f.value)
			if indexed {
				d.add(f)
			}
			p, updates = rest, -1
		}
	}
	return nil
}

func (d *hpackDecoder) field(idx uint64) (headerField, error) {
	switch {
	case idx == 0:
		return headerField{}, errHpack
	case idx <= uint64(len(staticTable)):
		return staticTable[idx-1], nil
	case idx-uint64(len(staticTable)) <= uint64(len(d.dynamic)):
		return d.dynamic[idx-uint64(len(staticTable))-1], nil
	}
	return headerField{}, errHpack
}

func entrySize(f headerField) int { return len(f.name) + len(f.value) + 32 }

func (d *hpackDecoder) add(f headerField) {
	n := entrySize(f)
	d.evict(n)
	if n > d.capacity { // larger than the table: it empties the table and is not added (§4.4)
		return
	}
	d.dynamic = append([]headerField{f}, d.dynamic...)
	d.size += n
}

// evict drops the oldest entries until room more bytes fit.
func (d *hpackDecoder) evict(room int) {
	for len(d.dynamic) > 0 && d.size+room > d.capacity {
		last := len(d.dynamic) - 1
		d.size -= entrySize(d.dynamic[last])
		d.dynamic = d.dynamic[:last]
	}
}

// hpackInt decodes an integer with an n-bit prefix (§5.1).
func hpackInt(p []byte, n uint) (uint64, []byte, error) {
	if len(p) == 0 {
		return 0, nil, errHpack
	}
	limit := uint64(1)<<n - 1
	i := uint64(p[0]) & limit
	p = p[1:]
	if i < limit {
		return i, p, nil
	}
	// Up to 63 bits: what golang.org/x/net/http2/hpack takes, so that
	// the two agree on every block (FuzzHpackDecode); a value past what
	// its use allows (an index, a length, a table size) fails there.
	for shift := uint(0); ; shift += 7 {
		if len(p) == 0 || shift >= 63 {
			return 0, nil, errHpack
		}
		b := p[0]
		p = p[1:]
		i += uint64(b&0x7f) << shift
		if b&0x80 == 0 {
			return i, p, nil
		}
	}
}

// hpackString decodes a string literal (§5.2).
func hpackString(p []byte) (string, []byte, error) {
	if len(p) == 0 {
		return "", nil, errHpack
	}
	huffman := p[0]&0x80 != 0
	n, rest, err := hpackInt(p, 7)
	if err != nil || n > uint64(len(rest)) {
		return "", nil, errHpack
	}
	raw, rest := rest[:n], rest[n:]
	if !huffman {
		return string(raw), rest, nil
	}
	s, err := huffmanDecode(raw)
	return s, rest, err
}

// huffmanDecode decodes the canonical Huffman code of Appendix B: codes of
// one length are consecutive, in symbol order, and each length's first code
// follows from the previous length's, so the code lengths are the whole
// table. The padding must be the most significant bits of EOS (all ones),
// at most 7 of them (§5.2).
func huffmanDecode(in []byte) (string, error) {
	var out strings.Builder
	out.Grow(len(in) * 8 / 5)
	code, length := uint32(0), 0
	for _, b := range in {
		for bit := 7; bit >= 0; bit-- {
			code = code<<1 | uint32(b>>bit)&1
			length++
			if length > maxCodeLength {
				return "", errHpack
			}
			c := &huffman.byLength[length]
			if code-c.first < c.count { // unsigned: also false when code < first
				sym := huffman.symbols[c.index+int(code-c.first)]
				if sym == eos {
					return "", errHpack
				}
				out.WriteByte(byte(sym))
				code, length = 0, 0
			}
		}
	}
	if length > 7 || code != 1<<length-1 {
		return "", errHpack
	}
	return out.String(), nil
}

const (
	eos           = 256
	maxCodeLength = 30
)

// huffman is the decoding table, derived from huffmanCodeLengths at start-up
// (a few microseconds).
var huffman = buildHuffman()

type huffmanTable struct {
	// byLength[n]: the first code of length n, how many codes have that
	// length, and where their symbols start in symbols.
	byLength [maxCodeLength + 1]struct {
		first, count uint32
		index        int
	}
	symbols [eos + 1]uint16 // by code length, then by symbol
}

func buildHuffman() *huffmanTable {
	t := &huffmanTable{}
	for _, n := range huffmanCodeLengths {
		t.byLength[n].count++
	}
	code, index := uint32(0), 0
	for n := 1; n <= maxCodeLength; n++ {
		code = (code + t.byLength[n-1].count) << 1
		t.byLength[n].first, t.byLength[n].index = code, index
		index += int(t.byLength[n].count)
	}
	next := make([]int, maxCodeLength+1)
	for n := range next {
		next[n] = t.byLength[n].index
	}
	for sym, n := range huffmanCodeLengths {
		t.symbols[next[n]] = uint16(sym)
		next[n]++
	}
	return t
}

// huffmanCodeLengths is the length in bits of each symbol's code (RFC 7541
// Appendix B; symbol 256 is EOS).
var huffmanCodeLengths = [eos + 1]uint8{
	13, 23, 28, 28, 28, 28, 28, 28, 28, 24, 30, 28, 28, 30, 28, 28,
	28, 28, 28, 28, 28, 28, 30, 28, 28, 28, 28, 28, 28, 28, 28, 28,
	6, 10, 10, 12, 13, 6, 8, 11, 10, 10, 8, 11, 8, 6, 6, 6,
	5, 5, 5, 6, 6, 6, 6, 6, 6, 6, 7, 8, 15, 6, 12, 10,
	13, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7,
	7, 7, 7, 7, 7, 7, 7, 7, 8, 7, 8, 13, 19, 13, 14, 6,
	15, 5, 6, 5, 6, 5, 6, 6, 6, 5, 7, 7, 6, 6, 6, 5,
	6, 7, 6, 5, 5, 6, 7, 7, 7, 7, 7, 15, 11, 14, 13, 28,
	20, 22, 20, 20, 22, 22, 22, 23, 22, 23, 23, 23, 23, 23, 24, 23,
	24, 24, 22, 23, 24, 23, 23, 23, 23, 21, 22, 23, 22, 23, 23, 24,
	22, 21, 20, 22, 22, 23, 23, 21, 23, 22, 22, 24, 21, 22, 23, 23,
	21, 21, 22, 21, 23, 22, 23, 23, 20, 22, 22, 22, 23, 22, 22, 23,
	26, 26, 20, 19, 22, 23, 22, 25, 26, 26, 26, 27, 27, 26, 24, 25,
	19, 21, 26, 27, 27, 26, 27, 24, 21, 21, 26, 26, 28, 27, 27, 27,
	20, 24, 20, 21, 22, 21, 21, 23, 22, 22, 25, 25, 24, 24, 26, 23,
	26, 27, 26, 26, 27, 27, 27, 27, 27, 28, 27, 27, 27, 27, 27, 26,
	30,
}

// staticTable is Appendix A.
var staticTable = [...]headerField{
	{":authority", ""}, {":method", "GET"}, {":method", "POST"}, {":path", "/"},
	{":path", "/index.html"}, {":scheme", "http"}, {":scheme", "https"}, {":status", "200"},
	{":status", "204"}, {":status", "206"}, {":status", "304"}, {":status", "400"},
	{":status", "404"}, {":status", "500"}, {"accept-charset", ""}, {"accept-encoding", "gzip, deflate"},
	{"accept-language", ""}, {"accept-ranges", ""}, {"accept", ""}, {"access-control-allow-origin", ""},
	{"age", ""}, {"allow", ""}, {"authorization", ""}, {"cache-control", ""},
	{"content-disposition", ""}, {"content-encoding", ""}, {"content-language", ""}, {"content-length", ""},
	{"content-location", ""}, {"content-range", ""}, {"content-type", ""}, {"cookie", ""},
	{"date", ""}, {"etag", ""}, {"expect", ""}, {"expires", ""},
	{"from", ""}, {"host", ""}, {"if-match", ""}, {"if-modified-since", ""},
	{"if-none-match", ""}, {"if-range", ""}, {"if-unmodified-since", ""}, {"last-modified", ""},
	{"link", ""}, {"location", ""}, {"max-forwards", ""}, {"proxy-authenticate", ""},
	{"proxy-authorization", ""}, {"range", ""}, {"referer", ""}, {"refresh", ""},
	{"retry-after", ""}, {"server", ""}, {"set-cookie", ""}, {"strict-transport-security", ""},
	{"transfer-encoding", ""}, {"user-agent", ""}, {"vary", ""}, {"via", ""},
	{"www-authenticate", ""},
}
