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

	"github.com/coordino/coordino/test/testbed"
)

func main() {
	log.SetFlags(log.Ltime)
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: testbed up|down")
		flag.PrintDefaults()
	}
	flag.Parse()
	var err error
	switch flag.Arg(0) {
	case "up":
		err = up()
	case "down":
		err = testbed.Teardown(envOr("COORDINO_TESTBED_DIR", "/run/coordino-testbed"), log.Printf)
	default:
		flag.Usage()
		os.Exit(2)
	}
	if err != nil {
		log.Fatal(err)
	}
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func up() (err error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	b, err := testbed.New(testbed.Options{Logf: log.Printf}, true)
	if err != nil {
		return err
	}
	defer func() {
		log.Print("tearing down")
		if terr := b.Teardown(); terr != nil && err == nil {
			err = terr
		}
	}()
	bin := filepath.Join(b.RepoRoot, "bin")
	if err := b.InstallPlugins([]string{bin, filepath.Join(bin, "ref"), "/usr/lib/cni"}, "coordino", "bridge", "host-local"); err != nil {
		return err
	}
	if err := b.StartContainerd(ctx); err != nil {
		return err
	}
	if err := b.BuildImages(); err != nil {
		return err
	}
	c, err := b.StartControlPlane(ctx)
	if err != nil {
		return err
	}
	if err := c.CreateRuntimeClasses(ctx); err != nil {
		return err
	}
	if err := testbed.CheckCIDRsFree(testbed.CoordinoCIDR4, testbed.BridgeCIDR4); err != nil {
		return err
	}
	daemonDir := filepath.Join(b.Dir, "coordino")
	bpfDir := filepath.Join(daemonDir, "bpf")
	if err := os.MkdirAll(bpfDir, 0o700); err != nil {
		return err
	}
	// A private bpffs: the bed's teardown unmounts everything under its dir.
	if err := syscall.Mount("bpf", bpfDir, "bpf", 0, "mode=0700"); err != nil {
		return fmt.Errorf("mount bpffs: %w", err)
	}
	d, err := b.StartDaemon(ctx, filepath.Join(bin, "coordino-daemon"), daemonDir, bpfDir, testbed.NodeName, testbed.CoordinoCIDR4)
	if err != nil {
		return err
	}
	primary := []map[string]any{testbed.CoordinoPlugin(d.RunDir)}
	for h, conf := range map[string][]map[string]any{
		testbed.HandlerDefault: primary,
		testbed.HandlerPrimary: primary,
		testbed.HandlerBridge:  b.BridgePlugins(testbed.BridgeCIDR4, "ipam-bridge"),
	} {
		name := testbed.NetPrimary
		if h == testbed.HandlerBridge {
			name = testbed.NetBridge
		}
		if err := b.WriteConflist(h, name, conf); err != nil {
			return err
		}
	}
	if err := b.StartKubelet(ctx, c); err != nil {
		return err
	}
	fmt.Printf(`
Test bed up: node %s Ready, Coordino serving pods from %s.
  export KUBECONFIG=%s
  kubectl run probe --image=%s --image-pull-policy=Never --overrides='{"spec":{"nodeName":"%s"}}'
  kubectl get pods -o wide
Logs in %s/logs. ^C tears everything down.
`, testbed.NodeName, testbed.CoordinoCIDR4, c.AdminCfg, testbed.ProbeImage, testbed.NodeName, b.Dir)
	<-ctx.Done()
	return nil
}
