//go:build linux

package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/coordino/coordino/test/cluster"
)

func main() {
	log.SetFlags(log.Ltime)
	workers := flag.Int("workers", 2, "worker nodes")
	noInstall := flag.Bool("no-install", false, "leave Coordino out (nodes stay NotReady until a CNI is installed)")
	datapath := flag.String("datapath", os.Getenv("COORDINO_CLUSTER_DATAPATH"), "start the daemons with --datapath=this (ebpf, nftables, auto; empty: the manifest's default); with datapath: the one every daemon must report")
	routing := flag.String("routing", os.Getenv("COORDINO_CLUSTER_ROUTING"), "bgp: the workers in two racks on different subnets behind an FRR router, daemons with --routing=bgp and a BGPPeerPolicy per rack (empty: one segment)")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: cluster [-workers N] [-no-install] [-datapath D] [-routing bgp] up|down|status|datapath (status: exit 0 when a bed is up; datapath: what enforces on each node of the bed, exit 1 unless every daemon reports -datapath)")
		flag.PrintDefaults()
	}
	flag.Parse()
	dir := os.Getenv("COORDINO_CLUSTER_DIR")
	if dir == "" {
		dir = cluster.DefaultDir
	}
	var err error
	switch flag.Arg(0) {
	case "up":
		err = up(*workers, *noInstall, *datapath, *routing, dir)
	case "down":
		err = down(dir)
	case "status":
		if !cluster.Running(dir) {
			fmt.Printf("no cluster bed is up in %s\n", dir)
			os.Exit(1)
		}
		fmt.Printf("cluster bed up in %s (KUBECONFIG=%s/pki/admin.kubeconfig)\n", dir, dir)
	case "datapath":
		err = checkDatapath(dir, *datapath)
	default:
		flag.Usage()
		os.Exit(2)
	}
	if err != nil {
		log.Fatal(err)
	}
}

// down removes the cluster and the logs a failed up kept.
func down(dir string) error {
	if err := cluster.Teardown(dir, log.Printf); err != nil {
		return err
	}
	return os.RemoveAll(cluster.SavedLogsDir(dir))
}

// checkDatapath prints what enforces policy on each node of the bed up in
// dir and fails unless it is want (any, when want is empty or auto): a bed
// kept from an earlier cluster-up may run another datapath than asked for.
func checkDatapath(dir, want string) error {
	if !cluster.Running(dir) {
		return fmt.Errorf("no cluster bed is up in %s", dir)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(dir, "pki", "admin.kubeconfig"))
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	got, err := cluster.CheckDatapath(ctx, client, want)
	for _, nd := range got {
		fmt.Printf("%s\n", nd)
	}
	if err != nil && want != "" {
		return fmt.Errorf("%w (make cluster-down, then make cluster-up DATAPATH=%s)", err, want)
	}
	return err
}

// datapathNote names the --datapath the daemons were started with.
func datapathNote(d string) string {
	if d == "" {
		return ""
	}
	return " with --datapath=" + d
}

// routingNote names the racks of a bed with routing bgp.
func routingNote(r, dir string) string {
	if r == "" {
		return ""
	}
	return fmt.Sprintf(" with --routing=%s, workers alternating between 10.233.0.0/24 and 10.233.1.0/24 behind FRR (vtysh --vty_socket %s/router -c 'show bgp ipv4 unicast')", r, dir)
}

func up(workers int, noInstall bool, datapath, routing, dir string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	c, err := cluster.Up(ctx, cluster.Options{Dir: dir, Workers: workers, SkipInstall: noInstall, Datapath: datapath, Routing: routing, Logf: log.Printf})
	if err != nil {
		return err
	}
	fmt.Printf(`
Cluster up: %d workers %v, Coordino installed from %s%s%s.
  export KUBECONFIG=%s
  alias kubectl=%s
  kubectl get nodes -o wide; kubectl -n coordino-system get pods -o wide
  kubectl run a --image=%s --overrides='{"spec":{"nodeName":"worker-1"}}' -- netexec
Logs in %s/logs. make cluster-down removes everything.
`, workers, c.Nodes, c.Overlay, datapathNote(c.Datapath), routingNote(c.Routing, dir), c.Kubeconfig, c.KubectlPath(), cluster.AgnhostImage, dir)
	return nil
}
