package config

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestFlagsAndFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "c.json")
	os.WriteFile(file, []byte(`{"standalone":true,"podCIDRs":["10.7.0.0/24"],"runDir":"/run/x","logLevel":"debug"}`), 0o600)
	o, err := Parse([]string{"--config", file, "--run-dir", "/run/y", "--node-name", "n1"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !o.Standalone || o.RunDir != "/run/y" || o.LogLevel != "debug" || o.NodeName != "n1" || len(o.Prefixes) != 1 || o.Prefixes[0].String() != "10.7.0.0/24" {
		t.Fatalf("options = %+v", o)
	}
	o, err = Parse([]string{"--standalone", "--pod-cidr", "10.8.0.1/24", "--pod-cidr", "fd00::/64"}, io.Discard)
	if err != nil || len(o.Prefixes) != 2 || o.Prefixes[0].String() != "10.8.0.0/24" {
		t.Fatalf("options = %+v, %v", o, err)
	}
}

func TestErrorsNameTheOption(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.json")
	os.WriteFile(bad, []byte(`{"podRange":["x"]}`), 0o600)
	for args, want := range map[string]string{
		"--standalone --pod-cidr nonsense": "pod-cidr",
		"--pod-cidr 10.0.0.0/24":           "pod-cidr is for --standalone only",
		"--kubeconfig relative":            "kubeconfig",
		"--run-dir relative":               "run-dir",
		"--log-level loud":                 "log-level",
		"--config " + bad:                  "podRange",
		"--policy-dir relative":            "policy-dir",
		"--standalone --datapath iptables": "datapath \"iptables\": want ebpf, nftables or auto",
	} {
		_, err := Parse(strings.Fields(args), io.Discard)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse(%s) err = %v, want mention of %q", args, err, want)
		}
	}
}

func TestDatapathDefaultsToAuto(t *testing.T) {
	o, err := Parse([]string{"--standalone"}, io.Discard)
	if err != nil || o.Datapath != "auto" {
		t.Fatalf("default datapath = %q (%v), want auto", o.Datapath, err)
	}
	o, err = Parse([]string{"--standalone", "--datapath", "nftables"}, io.Discard)
	if err != nil || o.Datapath != "nftables" {
		t.Fatalf("--datapath nftables = %q (%v)", o.Datapath, err)
	}
}

func TestConntrackSize(t *testing.T) {
	o, err := Parse(nil, io.Discard)
	if err != nil || o.ConntrackSize != 1<<18 {
		t.Fatalf("default conntrack size %d, %v", o.ConntrackSize, err)
	}
	file := filepath.Join(t.TempDir(), "c.json")
	os.WriteFile(file, []byte(`{"conntrackSize":4096}`), 0o600)
	if o, err = Parse([]string{"--config", file}, io.Discard); err != nil || o.ConntrackSize != 4096 {
		t.Fatalf("file: conntrack size %d, %v", o.ConntrackSize, err)
	}
	if o, err = Parse([]string{"--config", file, "--conntrack-size", "8192"}, io.Discard); err != nil || o.ConntrackSize != 8192 {
		t.Fatalf("flag over file: conntrack size %d, %v", o.ConntrackSize, err)
	}
}

func TestMapSizes(t *testing.T) {
	file := filepath.Join(t.TempDir(), "c.json")
	os.WriteFile(file, []byte(`{"endpointsMapSize":4,"ipcacheMapSize":100,"policyMapSize":200,"sourceMapSize":300,"fragMapSize":400,"nodeIsolationMapSize":600}`), 0o600)
	o, err := Parse([]string{"--config", file, "--policy-map-size", "500"}, io.Discard)
	if err != nil || o.EndpointsMapSize != 4 || o.IpcacheMapSize != 100 || o.PolicyMapSize != 500 || o.SourceMapSize != 300 || o.FragMapSize != 400 ||
		o.NodeIsolationMapSize != 600 {
		t.Fatalf("options = %+v, %v", o, err)
	}
	o, err = Parse([]string{"--endpoints-map-size", "8", "--ipcache-map-size", "9", "--source-map-size", "10", "--frag-map-size", "11",
		"--node-isolation-map-size", "12"}, io.Discard)
	if err != nil || o.EndpointsMapSize != 8 || o.IpcacheMapSize != 9 || o.PolicyMapSize != 0 || o.SourceMapSize != 10 || o.FragMapSize != 11 ||
		o.NodeIsolationMapSize != 12 {
		t.Fatalf("options = %+v, %v", o, err)
	}
}
