package config

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestMasqueradeOptions(t *testing.T) {
	o, err := Parse(nil, io.Discard)
	if err != nil || !o.Masquerade.Masquerade || len(o.NonMasqueradePrefixes) != 0 {
		t.Fatalf("defaults: masquerade %v, non-masquerade %v, err %v; want on and none", o.Masquerade.Masquerade, o.NonMasqueradePrefixes, err)
	}
	o, err = Parse([]string{"--masquerade=false", "--non-masquerade-cidrs", "172.16.0.1/12, fd00:aa::/48"}, io.Discard)
	if err != nil || o.Masquerade.Masquerade || len(o.NonMasqueradePrefixes) != 2 || o.NonMasqueradePrefixes[0].String() != "172.16.0.0/12" {
		t.Fatalf("flags: %+v, %v", o.Masquerade, err)
	}
	file := filepath.Join(t.TempDir(), "c.json")
	if err := os.WriteFile(file, []byte(`{"masquerade":false,"nonMasqueradeCIDRs":["10.0.0.0/8"]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	o, err = Parse([]string{"--config", file, "--masquerade"}, io.Discard)
	if err != nil || !o.Masquerade.Masquerade || len(o.NonMasqueradePrefixes) != 1 {
		t.Fatalf("file then flag: %+v, %v; want masquerade on (flag) and the file's range", o.Masquerade, err)
	}
	if _, err := Parse([]string{"--non-masquerade-cidrs", "10.0.0.0/40"}, io.Discard); err == nil || !strings.Contains(err.Error(), "non-masquerade-cidrs") {
		t.Fatalf("bad CIDR: %v, want an error naming non-masquerade-cidrs", err)
	}
}
