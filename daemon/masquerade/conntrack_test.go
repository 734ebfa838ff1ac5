package masquerade

import "testing"

const statSample = `entries  clashres found new invalid ignore delete chainlength insert insert_failed drop early_drop icmp_error  expect_new expect_create expect_delete search_restart
00000003  00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 0000000a 00000002 00000001 00000000  00000000 00000000 00000000 00000000
00000003  00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000005 00000001 00000000 00000000  00000000 00000000 00000000 00000000
`

func TestParseConntrackStats(t *testing.T) {
	st, err := parseConntrackStats([]byte(statSample))
	if err != nil {
		t.Fatal(err)
	}
	if want := (ConntrackStats{InsertFailed: 15, Drop: 3, EarlyDrop: 1}); st != want {
		t.Fatalf("got %+v, want %+v", st, want)
	}
	for _, bad := range []string{"", "insert_failed drop\n1\n", "insert_failed drop\nzz 1\n"} {
		if _, err := parseConntrackStats([]byte(bad)); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestReadConntrackStats(t *testing.T) {
	if _, err := ReadConntrackStats(); err != nil {
		t.Fatal(err)
	}
}

func FuzzParseConntrackStats(f *testing.F) {
	f.Add([]byte(statSample))
	f.Add([]byte("drop\nffffffffffffffff\nffffffffffffffff\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		_, _ = parseConntrackStats(data)
	})
}
