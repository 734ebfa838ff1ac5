//go:build linux

package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"

	"github.com/coordino/coordino/test/cluster"
)

func main() {
	log.SetFlags(log.Ltime)
	workers := flag.Int("workers", 2, "worker nodes")
	noInstall := flag.Bool("no-install", false, "leave Coordino out (nodes stay NotReady until a CNI is installed)")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: cluster [-workers N] [-no-install] up|down|status (status: exit 0 when a bed is up)")
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
		err = up(*workers, *noInstall, dir)
	case "down":
		err = down(dir)
	case "status":
		if !cluster.Running(dir) {
			fmt.Printf("no cluster bed is up in %s\n", dir)
			os.Exit(1)
		}
		fmt.Printf("cluster bed up in %s (KUBECONFIG=%s/pki/admin.kubeconfig)\n", dir, dir)
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

func up(workers int, noInstall bool, dir string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	c, err := cluster.Up(ctx, cluster.Options{Dir: dir, Workers: workers, SkipInstall: noInstall, Logf: log.Printf})
	if err != nil {
		return err
	}
	fmt.Printf(`
Cluster up: %d workers %v, Coordino installed from %s.
  export KUBECONFIG=%s
  alias kubectl=%s
  kubectl get nodes -o wide; kubectl -n coordino-system get pods -o wide
  kubectl run a --image=%s --overrides='{"spec":{"nodeName":"worker-1"}}' -- netexec
Logs in %s/logs. make cluster-down removes everything.
`, workers, c.Nodes, c.Overlay, c.Kubeconfig, c.KubectlPath(), cluster.AgnhostImage, dir)
	return nil
}
