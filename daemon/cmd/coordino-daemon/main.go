// Command coordino-daemon is the Coordino node daemon.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/coordino/coordino/daemon"
	"github.com/coordino/coordino/daemon/config"
)

func main() {
	opts, err := config.Parse(os.Args[1:], os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "coordino-daemon:", err)
		os.Exit(2)
	}
	log, err := newLogger(opts.LogLevel)
	if err != nil {
		fmt.Fprintln(os.Stderr, "coordino-daemon:", err)
		os.Exit(2)
	}
	defer log.Sync() //nolint:errcheck
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := daemon.Run(ctx, opts, log.With(zap.String("node", opts.NodeName))); err != nil {
		log.Error("daemon stopped", zap.Error(err))
		os.Exit(1)
	}
}

func newLogger(level string) (*zap.Logger, error) {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, err
	}
	cfg := zap.NewProductionConfig()
	cfg.Level = zap.NewAtomicLevelAt(lvl)
	cfg.Sampling = nil
	return cfg.Build()
}
