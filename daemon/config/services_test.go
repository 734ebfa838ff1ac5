package config

import (
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestServiceCIDRs(t *testing.T) {
	o, err := Parse([]string{"--service-cidrs", "10.96.0.1/16, fd00:96::/108", "--service-cidrs", "10.97.0.0/16"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range o.ServicePrefixes {
		got = append(got, p.String())
	}
	if want := []string{"10.96.0.0/16", "fd00:96::/108", "10.97.0.0/16"}; !slices.Equal(got, want) {
		t.Fatalf("service prefixes %v, want %v", got, want)
	}
	file := filepath.Join(t.TempDir(), "c.json")
	os.WriteFile(file, []byte(`{"serviceCIDRs":["10.100.0.0/16"],"noServiceHook":true}`), 0o600)
	o, err = Parse([]string{"--config", file, "--service-cidrs", "10.96.0.0/12"}, io.Discard)
	if err != nil || !o.NoServiceHook || len(o.ServicePrefixes) != 1 || o.ServicePrefixes[0].String() != "10.96.0.0/12" {
		t.Fatalf("flag over file: %+v, %v", o.Services, err)
	}
	_, err = Parse([]string{"--service-cidrs", "10.96.0.0/33"}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "service-cidrs") {
		t.Fatalf("bad CIDR: %v, want an error naming service-cidrs", err)
	}
}
