package policy

import (
	"testing"
)

// Each mode gets one daemon and one set of pods; cases swap the policy
// file. All cases run in the default mode (primary, clsact + cls_bpf), the
// representative subset in the others (the semantics are shared; what
// differs is attach and chaining).

func TestPrimaryTC(t *testing.T)  { runMode(t, primaryTC, true) }
func TestPrimaryTCX(t *testing.T) { runMode(t, primaryTCX, false) }
func TestChained(t *testing.T)    { runMode(t, chained, false) }

// TestPrimaryNFTables runs every case on the nftables datapath: the
// semantics are the engine's, but the rendering is all its own.
func TestPrimaryNFTables(t *testing.T) { runMode(t, primaryNFT, true) }

func runMode(t *testing.T, m mode, all bool) {
	b := newBed(t, m)
	b.checkAttachMode()
	t.Run("matrix", func(t *testing.T) {
		for _, c := range cases {
			if !all && !c.subset {
				continue
			}
			t.Run(c.name, func(t *testing.T) { b.runCase(t, c) })
		}
	})
	t.Run("restart-under-traffic", func(t *testing.T) { b.restartUnderTraffic(t) })
	t.Run("update-under-traffic", func(t *testing.T) { b.updateUnderTraffic(t) })
	t.Run("new-pod-denied-from-first-packet", func(t *testing.T) { b.newPodDenied(t, false) })
	t.Run("udp-revoked-on-isolated-pod", func(t *testing.T) { b.udpRevokedOnIsolated(t) })
	if all {
		t.Run("broken-file-at-restart", func(t *testing.T) { b.brokenFileAtRestart(t) })
	}
}

func (b *bed) runCase(t *testing.T, c policyCase) {
	b.t = t
	docs := c.policy(b)
	if err := b.apply(docs); err != nil {
		t.Fatal(err)
	}
	if err := b.expectMatrix(c.want()); err != nil {
		t.Fatalf("%v\npolicy:\n%s", err, docs)
	}
}

// TestCaseCount keeps the matrix at least as large as the issue asks.
func TestCaseCount(t *testing.T) {
	subset, names := 0, map[string]bool{}
	for _, c := range cases {
		if names[c.name] {
			t.Errorf("duplicate case %q", c.name)
		}
		names[c.name] = true
		if c.subset {
			subset++
		}
	}
	if len(cases) < 25 || subset < 8 {
		t.Fatalf("%d cases (%d in the subset), want at least 25 (8)", len(cases), subset)
	}
}
