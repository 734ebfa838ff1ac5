// Command coordino-daemon is the Coordino node daemon.
package main

import (
	"fmt"
	"os"

	"go.uber.org/zap"

	"github.com/coordino/coordino/daemon"
	"github.com/coordino/coordino/daemon/config"
	"github.com/coordino/coordino/internal/process"
)

func main() {
	opts, err := config.Parse(os.Args[1:], os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "coordino-daemon:", err)
		os.Exit(2)
	}
	log, err := process.NewLogger(opts.LogLevel)
	if err != nil {
		fmt.Fprintln(os.Stderr, "coordino-daemon:", err)
		os.Exit(2)
	}
	defer log.Sync() //nolint:errcheck
	ctx, stop := process.SignalContext()
	defer stop()
	if err := daemon.Run(ctx, opts, log.With(zap.String("node", opts.NodeName))); err != nil {
		log.Error("daemon stopped", zap.Error(err))
		os.Exit(1)
	}
}
