// Command coordino-controller is Coordino's leader-elected cluster
// controller: node address blocks, identities and compiled policy (PolicyIR).
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/coordino/coordino/controller"
)

func main() {
	opts, err := controller.Parse(os.Args[1:], os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "coordino-controller:", err)
		os.Exit(2)
	}
	lvl, err := zapcore.ParseLevel(opts.LogLevel)
	if err != nil {
		fmt.Fprintln(os.Stderr, "coordino-controller: --log-level:", err)
		os.Exit(2)
	}
	zcfg := zap.NewProductionConfig()
	zcfg.Level = zap.NewAtomicLevelAt(lvl)
	log, err := zcfg.Build()
	if err != nil {
		fmt.Fprintln(os.Stderr, "coordino-controller:", err)
		os.Exit(2)
	}
	defer log.Sync() //nolint:errcheck
	cfg, err := controller.RESTConfig(opts.Kubeconfig)
	if err != nil {
		log.Error("no Kubernetes client configuration", zap.Error(err))
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := controller.Run(ctx, cfg, opts, log); err != nil {
		log.Error("controller stopped", zap.Error(err))
		os.Exit(1)
	}
}
