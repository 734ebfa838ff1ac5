package nftdp

import (
	"slices"
	"strings"
	"testing"

	"github.com/google/nftables"

	"github.com/coordino/coordino/internal/schema"
)

// restamp replaces the table's stamps by s (none for the zero Stamp: a
// table written before stamps).
func restamp(t *testing.T, s schema.Stamp) {
	t.Helper()
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	table := newLayout().table
	old, err := readStamps(c, table)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range old {
		c.DeleteObject(&nftables.CounterObj{Table: table, Name: stampName(o)})
	}
	if s != (schema.Stamp{}) {
		c.AddObj(&nftables.CounterObj{Table: table, Name: stampName(s)})
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
}

func stamps(t *testing.T) []schema.Stamp {
	t.Helper()
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	s, err := readStamps(c, newLayout().table)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestTableStamped: a new table carries this build's stamp; a table
// written before stamps (version 1) is migrated at Open, its policy in
// force throughout.
func TestTableStamped(t *testing.T) {
	c := newCluster(t, false)
	if got := stamps(t); !slices.Equal(got, []schema.Stamp{TableFormat.Stamp()}) {
		t.Fatalf("new table stamped %v, want %v", got, TableFormat.Stamp())
	}
	c.policies(serverFromClientsOn80)
	restamp(t, schema.Stamp{})
	c.open() // the restarted daemon, before its first snapshot
	if got := stamps(t); !slices.Equal(got, []schema.Stamp{TableFormat.Stamp()}) {
		t.Errorf("migrated table stamped %v, want %v", got, TableFormat.Stamp())
	}
	c.expect(false, "c>b tcp/80")
	c.expect(true, "a>b tcp/80")
}

// TestTableTooNew: a daemon meeting a table a newer one wrote that it
// cannot read refuses it naming both versions and leaves it, and its
// policy, as they are; one it can read (an additive change) it uses and
// leaves stamped as the newer one.
func TestTableTooNew(t *testing.T) {
	c := newCluster(t, false)
	c.policies(serverFromClientsOn80)
	newer := schema.Stamp{Version: TableFormat.Current + 1, MinReader: TableFormat.Current + 1}
	restamp(t, newer)
	_, err := Open(c.cfg)
	if !schema.IsTooNew(err) || !strings.Contains(err.Error(), "inet coordino-policy") {
		t.Fatalf("Open of a newer table: %v, want a TooNewError naming the table", err)
	}
	if got := stamps(t); !slices.Equal(got, []schema.Stamp{newer}) {
		t.Errorf("refused table restamped %v", got)
	}
	c.expect(false, "c>b tcp/80")
	c.expect(true, "a>b tcp/80")

	readable := schema.Stamp{Version: TableFormat.Current + 1, MinReader: TableFormat.Current}
	restamp(t, readable)
	c.open()
	c.policies(serverFromClientsOn80)
	if got := stamps(t); !slices.Equal(got, []schema.Stamp{readable}) {
		t.Errorf("readable newer table stamped %v, want it kept at %v", got, readable)
	}
	c.expect(false, "c>b tcp/80")
}

func TestParseStamp(t *testing.T) {
	for name, want := range map[string]bool{"schema-v2-min1": true, "schema-v2-min1x": false, "schema-v02-min1": false,
		"egress-spoofed": false, "schema-v-min1": false} {
		if _, ok := parseStamp(name); ok != want {
			t.Errorf("parseStamp(%q) = %v, want %v", name, ok, want)
		}
	}
}
