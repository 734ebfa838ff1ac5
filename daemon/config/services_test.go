package config

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/coordino/coordino/bpf"
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

// TestServiceCIDRsLimit: more distinct ranges than the datapath's map holds
// are refused at parse time, naming the flag; repeats count once.
func TestServiceCIDRsLimit(t *testing.T) {
	var cidrs []string
	for i := range MaxServiceCIDRs {
		cidrs = append(cidrs, fmt.Sprintf("10.%d.0.0/16", i))
	}
	cidrs = append(cidrs, "10.0.0.1/16") // the first again
	if _, err := Parse([]string{"--service-cidrs", strings.Join(cidrs, ",")}, io.Discard); err != nil {
		t.Fatalf("%d ranges: %v", MaxServiceCIDRs, err)
	}
	cidrs = append(cidrs, "fd00:96::/108")
	_, err := Parse([]string{"--service-cidrs", strings.Join(cidrs, ",")}, io.Discard)
	if want := "service-cidrs: 65 ranges, at most 64"; err == nil || err.Error() != want {
		t.Fatalf("%d ranges: got %v, want %q", MaxServiceCIDRs+1, err, want)
	}
	spec, err := bpf.LoadCoordino()
	if err != nil {
		t.Fatal(err)
	}
	if n := spec.Maps[bpf.CoordinoMapCdoSvcCidrs].MaxEntries; n != MaxServiceCIDRs {
		t.Errorf("cdo_svc_cidrs holds %d, MaxServiceCIDRs says %d", n, MaxServiceCIDRs)
	}
}
