package policy

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	inspectv1 "github.com/coordino/coordino/proto/inspect/v1"
)

var explainMode = mode{name: "explain", subnet: "10.184.0.0/24"}

// TestExplainAgreesWithMatrix asks the daemon's policy explanation (what
// `coordinoctl policy explain` prints) about every (source, target,
// service) of every case and compares its verdict with the documented
// truth table; for the representative subset the same run also probes the
// matrix with real traffic, so explanation, datapath and documentation are
// checked against each other. A pod talking to itself never crosses its
// veth and the node is always allowed: those triples are compared only
// where explain models them (the node).
func TestExplainAgreesWithMatrix(t *testing.T) { runExplainMatrix(t, explainMode) }

// TestExplainAgreesWithMatrixNFTables is the same on --datapath=nftables:
// explain decides from what the table was rendered from and names the
// rules with the same explainer.
func TestExplainAgreesWithMatrixNFTables(t *testing.T) {
	runExplainMatrix(t, mode{name: "explain-nftables", nft: true, subnet: "10.186.0.0/24"})
}

func runExplainMatrix(t *testing.T, m mode) {
	b := newBed(t, m)
	conn, err := grpc.NewClient("unix://"+filepath.Join(b.node.RunDir, "inspect.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := inspectv1.NewInspectorClient(conn)
	start, queries := time.Now(), 0
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b.t = t
			docs := c.policy(b)
			if err := b.apply(docs); err != nil {
				t.Fatal(err)
			}
			if c.subset {
				if err := b.expectMatrix(c.want()); err != nil {
					t.Fatalf("traffic: %v", err)
				}
			}
			want := c.want().final()
			var wrong []string
			for i, f := range sources {
				from := b.node.NodeIP.String()
				if f != nodePeer {
					from = b.pod(f).ip.String()
				}
				for j, d := range pods {
					if f == d {
						continue
					}
					for k, s := range services {
						ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
						ex, err := client.ExplainPolicy(ctx, &inspectv1.ExplainPolicyRequest{From: from, To: b.pod(d).ip.String(), Protocol: s.proto, Port: uint32(s.port)})
						cancel()
						queries++
						if err != nil {
							t.Fatalf("explain %s -> %s %s: %v", f, d, s, err)
						}
						if (ex.Verdict == "allowed") != want.ok[i][j][k] {
							wrong = append(wrong, fmt.Sprintf("%s -> %s %s: explain says %s, truth says allowed=%t: %s", f, d, s, ex.Verdict, want.ok[i][j][k], ex.Summary))
						}
						// A NetworkPolicy denial names the policies isolating the pod,
						// a tier's its deciding ClusterNetworkPolicy rule.
						if ex.Verdict == "denied" && !strings.Contains(ex.Summary, "default deny of ") && !strings.Contains(ex.Summary, "decided by ") {
							wrong = append(wrong, fmt.Sprintf("%s -> %s %s: denial names no policy: %s", f, d, s, ex.Summary))
						}
					}
				}
			}
			if len(wrong) > 0 {
				t.Fatalf("%d explanations disagree with the truth table:\n%s\npolicy:\n%s", len(wrong), strings.Join(wrong, "\n"), docs)
			}
		})
	}
	t.Logf("%d explanations in %v", queries, time.Since(start).Round(time.Millisecond))
}
