package unarygrpc

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"

	"golang.org/x/net/http2/hpack"
)

// The code lengths are the RFC's: a string of eight copies of one byte
// Huffman-codes to exactly as many bytes as that byte's code has bits.
func TestHuffmanCodeLengthsAreTheRFCs(t *testing.T) {
	for b := 0; b < 256; b++ {
		want := hpack.HuffmanEncodeLength(strings.Repeat(string([]byte{byte(b)}), 8))
		if uint64(huffmanCodeLengths[b]) != want {
			t.Fatalf("symbol %d: length %d, RFC %d", b, huffmanCodeLengths[b], want)
		}
	}
}

func TestHuffmanDecodesWhatHpackEncodes(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	inputs := []string{"", "a", "application/grpc", "grpc-status", "bad mtu: 100%25", "\x00\xff\x7f\x80"}
	for i := 0; i < 2000; i++ {
		b := make([]byte, r.IntN(64))
		for j := range b {
			b[j] = byte(r.UintN(256))
		}
		inputs = append(inputs, string(b))
	}
	for _, in := range inputs {
		got, err := huffmanDecode(hpack.AppendHuffmanString(nil, in))
		if err != nil || got != in {
			t.Fatalf("%q: decoded %q, %v", in, got, err)
		}
	}
}

func TestHuffmanRefusesBadPadding(t *testing.T) {
	enc := hpack.AppendHuffmanString(nil, "a") // 5 bits of code, 3 of padding (ones)
	for _, bad := range [][]byte{
		{enc[0] &^ 1},            // padding not all ones
		append(enc, 0xff),        // 8 or more bits of padding
		{0xff, 0xff, 0xff, 0xfc}, // EOS itself (30 ones)
	} {
		if s, err := huffmanDecode(bad); err == nil {
			t.Fatalf("%x decoded to %q", bad, s)
		}
	}
}

func TestStaticTableIsTheRFCs(t *testing.T) {
	for i, f := range staticTable {
		var buf bytes.Buffer
		if err := hpack.NewEncoder(&buf).WriteField(hpack.HeaderField{Name: f.name, Value: f.value}); err != nil {
			t.Fatal(err)
		}
		if want := []byte{0x80 | byte(i+1)}; !bytes.Equal(buf.Bytes(), want) {
			t.Fatalf("entry %d %q: %q is encoded as %x, not as index %d", i+1, f.name, f.value, buf.Bytes(), i+1)
		}
	}
}

// Blocks as a server's encoder writes them (indexing, Huffman, table size
// updates, a table that evicts) decode to the same fields, in order.
func TestDecoderAgainstHpackEncoder(t *testing.T) {
	var buf bytes.Buffer
	enc := hpack.NewEncoder(&buf)
	dec := newHpackDecoder()
	r := rand.New(rand.NewPCG(3, 4))
	for block := 0; block < 300; block++ {
		buf.Reset()
		if block%50 == 7 {
			enc.SetMaxDynamicTableSize(uint32(r.IntN(headerTableSize + 1)))
		}
		var want []hpack.HeaderField
		for f := 0; f < 1+r.IntN(8); f++ {
			hf := hpack.HeaderField{Name: []string{":status", "content-type", "grpc-status", "grpc-message", "x-" + strings.Repeat("n", r.IntN(300))}[r.IntN(5)]}
			hf.Value = strings.Repeat(string(rune('a'+r.IntN(26))), r.IntN(200))
			hf.Sensitive = r.IntN(10) == 0
			if err := enc.WriteField(hf); err != nil {
				t.Fatal(err)
			}
			want = append(want, hf)
		}
		var got []hpack.HeaderField
		if err := dec.decode(buf.Bytes(), func(n, v string) { got = append(got, hpack.HeaderField{Name: n, Value: v}) }); err != nil {
			t.Fatalf("block %d: %v", block, err)
		}
		if len(got) != len(want) {
			t.Fatalf("block %d: %d fields, want %d", block, len(got), len(want))
		}
		for i := range want {
			if got[i].Name != want[i].Name || got[i].Value != want[i].Value {
				t.Fatalf("block %d field %d: %q: %q, want %q: %q", block, i, got[i].Name, got[i].Value, want[i].Name, want[i].Value)
			}
		}
	}
}

func TestEncodedRequestHeadersDecode(t *testing.T) {
	var block []byte
	fields := []hpack.HeaderField{{Name: ":path", Value: "/coordino.cni.v1.CNI/Add"}, {Name: "traceparent", Value: strings.Repeat("0", 200)}}
	for _, f := range fields {
		block = appendHeaderField(block, f.Name, f.Value)
	}
	got, err := hpack.NewDecoder(headerTableSize, nil).DecodeFull(block)
	if err != nil || len(got) != len(fields) || got[0] != fields[0] || got[1] != fields[1] {
		t.Fatalf("decoded %v, %v", got, err)
	}
}

// FuzzHpackDecode decodes two blocks in a row (the dynamic table carries
// over) with this decoder and with golang.org/x/net/http2/hpack: both accept
// the same blocks and emit the same fields. Two differences are allowed,
// both RFC 7541 §4.2's: a dynamic table size update after a field is an
// error here, which x/net lets pass while its table is empty; two updates
// may start a block, where x/net takes one while its table has entries.
func FuzzHpackDecode(f *testing.F) {
	var buf bytes.Buffer
	enc := hpack.NewEncoder(&buf)
	_ = enc.WriteField(hpack.HeaderField{Name: ":status", Value: "200"})
	_ = enc.WriteField(hpack.HeaderField{Name: "content-type", Value: "application/grpc"})
	first := append([]byte(nil), buf.Bytes()...)
	buf.Reset()
	_ = enc.WriteField(hpack.HeaderField{Name: "grpc-status", Value: "0"})
	_ = enc.WriteField(hpack.HeaderField{Name: "grpc-message", Value: "bad mtu: 100%25"})
	_ = enc.WriteField(hpack.HeaderField{Name: "content-type", Value: "application/grpc"})
	f.Add(first, buf.Bytes())
	f.Add([]byte{0x3f, 0xe1, 0x1f}, []byte{0x88})                  // table size update past the limit
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0x0f}, []byte(nil)) // index past 2^28
	f.Add([]byte{0x40, 0x01, 'a', 0x01, 'b', 0x20}, []byte{0xbe})  // size update after a field
	f.Add([]byte{0x88, 0x20}, []byte{0x88})                        // the same with an empty table
	f.Fuzz(func(t *testing.T, a, b []byte) {
		ours := newHpackDecoder()
		ref := hpack.NewDecoder(headerTableSize, nil)
		for i, block := range [][]byte{a, b} {
			var got []hpack.HeaderField
			err := ours.decode(block, func(n, v string) { got = append(got, hpack.HeaderField{Name: n, Value: v}) })
			want, refErr := ref.DecodeFull(block)
			switch {
			case err != nil && refErr != nil:
				return // the connection ends at the first bad block
			case errors.Is(err, errLateSizeUpdate):
				return
			case err == nil && twoSizeUpdates(block):
				return
			case err != nil || refErr != nil:
				t.Fatalf("block %d %x: this decoder: %v, x/net: %v", i, block, err, refErr)
			}
			if len(got) != len(want) {
				t.Fatalf("block %d: %d fields, x/net %d", i, len(got), len(want))
			}
			for j := range want {
				if got[j].Name != want[j].Name || got[j].Value != want[j].Value {
					t.Fatalf("block %d field %d: %q: %q, x/net %q: %q", i, j, got[j].Name, got[j].Value, want[j].Name, want[j].Value)
				}
			}
		}
	})
}

func twoSizeUpdates(block []byte) bool {
	if len(block) == 0 || block[0]&0xe0 != 0x20 {
		return false
	}
	_, rest, err := hpackInt(block, 5)
	return err == nil && len(rest) > 0 && rest[0]&0xe0 == 0x20
}

// Size updates may start a block, up to two, but not follow a field
// (RFC 7541 §4.2).
func TestDecoderRefusesSizeUpdateAfterAField(t *testing.T) {
	d := newHpackDecoder()
	if err := d.decode([]byte{0x20, 0x3f, 0xe1, 0x1f, 0x88}, func(string, string) {}); err != nil {
		t.Fatalf("two updates at the start: %v", err)
	}
	if err := d.decode([]byte{0x20, 0x20, 0x20, 0x88}, func(string, string) {}); !errors.Is(err, errLateSizeUpdate) {
		t.Fatalf("three updates: %v", err)
	}
	if err := d.decode([]byte{0x88, 0x20}, func(string, string) {}); !errors.Is(err, errLateSizeUpdate) {
		t.Fatalf("update after a field: %v", err)
	}
}
