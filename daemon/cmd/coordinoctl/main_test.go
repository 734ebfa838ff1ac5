package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestParsePort(t *testing.T) {
	for in, want := range map[string]struct {
		port  uint32
		proto string
	}{"80/TCP": {80, "TCP"}, "53/udp": {53, "UDP"}, "5432": {5432, "TCP"}, "0/ICMP": {0, "ICMP"}} {
		p, proto, err := parsePort(in)
		if err != nil || p != want.port || proto != want.proto {
			t.Errorf("parsePort(%q) = %d %q %v", in, p, proto, err)
		}
	}
	for _, bad := range []string{"", "http/TCP", "70000/TCP", "-1"} {
		if _, _, err := parsePort(bad); err == nil {
			t.Errorf("parsePort(%q) accepted", bad)
		}
	}
}

func TestUsageErrorsExitTwo(t *testing.T) {
	for _, args := range [][]string{
		{"nosuch"},
		{"status", "-o", "xml"},
		{"endpoint", "get"},
		{"status", "extra"},
		{"policy", "explain", "--from", "a", "--to", "b", "--port", "x/TCP", "--socket", "/nonexistent"},
		{"flows", "--verdict", "maybe", "--socket", "/nonexistent"},
		{"completion", "fish"},
	} {
		var out, errb bytes.Buffer
		if code := run(args, &out, &errb); code != 2 {
			t.Errorf("%v: exit %d, want 2 (stderr %q)", args, code, errb.String())
		}
	}
}

func TestCompletionListsCommandsAndFlags(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"completion", "bash"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	for _, want := range []string{"complete -F _coordinoctl coordinoctl", "explain", "--follow", "--since", "-o", "bugtool"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("completion lacks %q", want)
		}
	}
}
