// Command coordino-install puts the Coordino CNI plugin and its config on a
// node (the DaemonSet's init and watcher containers run it), keeps the config
// in place with --watch, and takes both off with --uninstall.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"go.uber.org/zap"

	"github.com/coordino/coordino/conflist"
	"github.com/coordino/coordino/install"
	"github.com/coordino/coordino/internal/process"
)

// defaultRunDir is the daemon's and the plugin's default run dir.
const defaultRunDir = "/run/coordino"

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "coordino-install: %v\n", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("coordino-install", flag.ContinueOnError)
	var (
		cfg                    install.Config
		mode                   string
		watch, uninstall, hold bool
		removeNodeState        bool
		bpfDir, stateDir       string
		debounce               time.Duration
	)
	fs.StringVar(&cfg.BinDir, "cni-bin-dir", install.DefaultBinDir, "host CNI plugin directory")
	fs.StringVar(&cfg.ConfDir, "cni-conf-dir", install.DefaultConfDir, "host CNI config directory")
	fs.StringVar(&mode, "mode", string(install.ModePrimary), "primary: Coordino is the node's CNI; chained: append Coordino to the existing primary CNI's chain")
	fs.StringVar(&cfg.PluginSource, "plugin-source", install.DefaultPluginSource, "the coordino plugin binary to copy into --cni-bin-dir (empty: do not copy)")
	fs.StringVar(&cfg.Priority, "priority", "", "numeric file name prefix of the config written (default 10 in primary mode, 00 in chained mode)")
	fs.StringVar(&cfg.Conflist.Name, "conflist-name", conflist.DefaultName, "network name of Coordino's conflist (primary mode)")
	fs.StringVar(&cfg.Conflist.CNIVersion, "cni-version", conflist.DefaultCNIVersion, "cniVersion of Coordino's conflist (primary mode)")
	fs.StringVar(&cfg.Conflist.RunDir, "run-dir", "", `plugin "runDir" (empty: plugin default /run/coordino); with --remove-node-state also the daemon's --run-dir`)
	fs.IntVar(&cfg.Conflist.MTU, "mtu", 0, `plugin "mtu" (0: let the daemon choose)`)
	fs.BoolVar(&cfg.Conflist.PortMap, "portmap", true, "primary mode: chain the portmap plugin after Coordino so pods' hostPorts work, and copy --portmap-source into --cni-bin-dir unless the host has its own portmap there")
	fs.StringVar(&cfg.PortMapSource, "portmap-source", install.DefaultPortMapSource, "the portmap plugin binary to copy into --cni-bin-dir (empty: do not copy)")
	fs.StringVar(&cfg.Conflist.PortMapBackend, "portmap-backend", "", `portmap "backend": iptables or nftables (empty: portmap picks iptables where the host has it, else nftables)`)
	fs.StringVar(&cfg.Conflist.LogLevel, "log-level", "", `plugin "logLevel": debug, info, warn or error (empty: plugin default)`)
	fs.BoolVar(&watch, "watch", false, "after installing, keep the config in place until SIGTERM, rewriting it when other CNIs change theirs")
	fs.DurationVar(&debounce, "debounce", 500*time.Millisecond, "with --watch: quiet time before reacting to changes in --cni-conf-dir")
	fs.BoolVar(&uninstall, "uninstall", false, "remove Coordino's configs and plugin binary instead of installing")
	fs.BoolVar(&removeNodeState, "remove-node-state", false, "with --uninstall: also detach the datapath programs and remove BPF pins and netns pins (the daemon must be stopped; needs the host network namespace and root)")
	fs.StringVar(&bpfDir, "bpf-dir", "/sys/fs/bpf/coordino", "with --remove-node-state: the daemon's --bpf-dir")
	fs.StringVar(&stateDir, "state-dir", "", "with --remove-node-state: the daemon's --state-dir, whose contents (endpoint store) are removed too (empty: left alone)")
	fs.BoolVar(&hold, "hold", false, "after a one-shot install or uninstall, stay running until SIGTERM (for a DaemonSet's main container)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if watch && uninstall {
		return errors.New("--watch and --uninstall exclude each other")
	}
	if removeNodeState {
		if !uninstall {
			return errors.New("--remove-node-state needs --uninstall")
		}
		runDir := cfg.Conflist.RunDir
		if runDir == "" {
			runDir = defaultRunDir
		}
		cfg.NodeState = &install.NodeState{RunDir: runDir, BPFDir: bpfDir, StateDir: stateDir}
	}
	cfg.Mode = install.Mode(mode)
	log, err := process.NewLogger("info")
	if err != nil {
		return err
	}
	defer log.Sync() //nolint:errcheck
	cfg.Log = log
	in, err := install.New(cfg)
	if err != nil {
		return err
	}

	ctx, stop := process.SignalContext()
	defer stop()
	switch {
	case watch:
		return in.Watch(ctx, install.WatchOptions{Debounce: debounce})
	case uninstall:
		err = in.Uninstall()
	default:
		err = in.Install()
	}
	if err != nil {
		return err
	}
	cfg.Log.Info("done", zap.Bool("uninstall", uninstall))
	if hold {
		<-ctx.Done()
	}
	return nil
}
