package e2e

import (
	"bytes"
	"cmp"
	"context"
	"encoding/hex"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracev1 "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"

	"github.com/coordino/coordino/test/harness"
)

// otlpReceiver is an in-test OTLP/gRPC trace collector.
type otlpReceiver struct {
	collectortrace.UnimplementedTraceServiceServer
	mu       sync.Mutex
	spans    []*tracev1.Span
	services []string
}

func (r *otlpReceiver) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rs := range req.ResourceSpans {
		for _, a := range rs.GetResource().GetAttributes() {
			if a.Key == "service.name" {
				r.services = append(r.services, a.Value.GetStringValue())
			}
		}
		for _, ss := range rs.ScopeSpans {
			r.spans = append(r.spans, ss.Spans...)
		}
	}
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

func (r *otlpReceiver) snapshot() ([]*tracev1.Span, []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.spans), slices.Clone(r.services)
}

func spanAttr(s *tracev1.Span, key string) string {
	for _, a := range s.Attributes {
		if a.Key == key {
			return a.Value.GetStringValue()
		}
	}
	return ""
}

// startNodeWithReceiver starts a node whose daemon exports traces to a
// receiver listening inside the node's netns (the daemon's loopback).
func startNodeWithReceiver(t *testing.T, cidr string) (*harness.Node, *otlpReceiver) {
	t.Helper()
	n := newIdleNode(t, harness.NodeOptions{PodCIDRs: []string{cidr}})
	var l net.Listener
	if err := n.NS.Do(func(ns.NetNS) error {
		var lerr error
		l, lerr = net.Listen("tcp", "127.0.0.1:0")
		return lerr
	}); err != nil {
		t.Fatal(err)
	}
	recv := &otlpReceiver{}
	g := grpc.NewServer()
	collectortrace.RegisterTraceServiceServer(g, recv)
	go g.Serve(l)
	t.Cleanup(g.Stop)
	// Export batches every 100 ms instead of every 5 s.
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
	n.ExtraArgs = append(n.ExtraArgs, "--otlp-endpoint", l.Addr().String())
	if err := n.StartDaemon(); err != nil {
		t.Fatal(err)
	}
	return n, recv
}

func TestTracesShowAddSpanTree(t *testing.T) {
	n, recv := startNodeWithReceiver(t, "10.97.0.0/24")
	c := newCNI(t, n, n.PrimaryConflist("coordino", "1.1.0"))
	// The runtime's trace context, as a process receives it (the plugin
	// inherits the environment through libcni).
	const traceID, parentID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	t.Setenv("TRACEPARENT", "00-"+traceID+"-"+parentID+"-01")
	pod, rt, _ := addPod(t, c, "traced")
	if err := c.Del(ctx(t), rt); err != nil {
		t.Fatal(err)
	}

	// In the order they start: the datapath attach runs while the veth's
	// two ends are configured, inside netlink.setup's time. The store
	// commit runs alongside the pin and the set-up, so where it starts
	// among them is the scheduler's choice; it is checked apart.
	want := []string{"request.parse", "deletequeue.apply", "ipam.allocate", "netns.pin", "netlink.setup", "bpf.attach"}
	deadline := time.Now().Add(10 * time.Second)
	for {
		spans, services := recv.snapshot()
		var root *tracev1.Span
		for _, s := range spans {
			if s.Name == "cni.ADD" && spanAttr(s, "cni.container_id") == pod.ContainerID {
				root = s
			}
		}
		var children []string
		var childSpans []*tracev1.Span
		if root != nil {
			for _, s := range spans {
				if bytes.Equal(s.ParentSpanId, root.SpanId) {
					if !bytes.Equal(s.TraceId, root.TraceId) || s.StartTimeUnixNano < root.StartTimeUnixNano || s.EndTimeUnixNano > root.EndTimeUnixNano {
						t.Fatalf("child %s is outside its parent %s", s.Name, root.Name)
					}
					childSpans = append(childSpans, s)
				}
			}
			slices.SortStableFunc(childSpans, func(a, b *tracev1.Span) int { return cmp.Compare(a.StartTimeUnixNano, b.StartTimeUnixNano) })
			commits := 0
			childSpans = slices.DeleteFunc(childSpans, func(s *tracev1.Span) bool {
				if s.Name == "store.commit" {
					commits++
					return true
				}
				return false
			})
			if commits > 1 {
				t.Fatalf("%d store.commit spans under one ADD", commits)
			}
			if commits == 0 {
				childSpans = nil // not exported yet
			}
			for _, s := range childSpans {
				children = append(children, s.Name)
			}
		}
		sawDel := slices.ContainsFunc(spans, func(s *tracev1.Span) bool {
			return s.Name == "cni.DEL" && spanAttr(s, "cni.container_id") == pod.ContainerID
		})
		if root != nil && sawDel && len(children) == len(want) {
			if !slices.Equal(children, want) {
				t.Fatalf("ADD children = %v, want %v in order", children, want)
			}
			if setup, attach := childSpans[4], childSpans[5]; attach.EndTimeUnixNano > setup.EndTimeUnixNano {
				t.Fatalf("bpf.attach ends after netlink.setup: the ADD did not wait for it inside the setup")
			}
			// The plugin's span sits between the runtime's and the daemon's.
			var plugin *tracev1.Span
			for _, s := range spans {
				if bytes.Equal(s.SpanId, root.ParentSpanId) {
					plugin = s
				}
			}
			if plugin == nil || plugin.Name != "cni.ADD plugin" || plugin.Kind != tracev1.Span_SPAN_KIND_CLIENT ||
				hex.EncodeToString(plugin.TraceId) != traceID || hex.EncodeToString(plugin.ParentSpanId) != parentID ||
				plugin.StartTimeUnixNano > root.StartTimeUnixNano || plugin.EndTimeUnixNano < root.EndTimeUnixNano {
				t.Fatalf("ADD span %x is not under a plugin span in the runtime's trace %s under %s: plugin span %v", root.SpanId, traceID, parentID, plugin)
			}
			t.Logf("plugin span %v before the daemon's, %v in all", time.Duration(root.StartTimeUnixNano-plugin.StartTimeUnixNano), time.Duration(plugin.EndTimeUnixNano-plugin.StartTimeUnixNano))
			if root.Kind != tracev1.Span_SPAN_KIND_SERVER || spanAttr(root, "k8s.pod.name") != pod.Name || spanAttr(root, "cni.ifname") != "eth0" {
				t.Fatalf("root span %v", root)
			}
			if !slices.Contains(services, "coordino-daemon") {
				t.Fatalf("service names %v", services)
			}
			t.Logf("ADD trace %s: %v", hex.EncodeToString(root.TraceId), children)
			return
		}
		if time.Now().After(deadline) {
			names := make([]string, len(spans))
			for i, s := range spans {
				names[i] = s.Name
			}
			t.Fatalf("no complete ADD span tree for %s within 10s: spans %v, root %v, children %v, DEL seen %t", pod.ContainerID, names, root != nil, children, sawDel)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
