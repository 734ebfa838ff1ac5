// Command coordino-controller is Coordino's leader-elected cluster
// controller: node address blocks, identities and compiled policy (PolicyIR).
package main

import (
	"fmt"
	"os"

	"go.uber.org/zap"

	"github.com/coordino/coordino/controller"
	"github.com/coordino/coordino/internal/process"
)

func main() {
	opts, err := controller.Parse(os.Args[1:], os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "coordino-controller:", err)
		os.Exit(2)
	}
	log, err := process.NewLogger(opts.LogLevel)
	if err != nil {
		fmt.Fprintln(os.Stderr, "coordino-controller: --"+err.Error())
		os.Exit(2)
	}
	defer log.Sync() //nolint:errcheck
	cfg, err := controller.RESTConfig(opts.Kubeconfig)
	if err != nil {
		log.Error("no Kubernetes client configuration", zap.Error(err))
		os.Exit(1)
	}
	ctx, stop := process.SignalContext()
	defer stop()
	if err := controller.Run(ctx, cfg, opts, log); err != nil {
		log.Error("controller stopped", zap.Error(err))
		os.Exit(1)
	}
}
