package main

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	inspectv1 "github.com/coordino/coordino/proto/inspect/v1"
)

// defaultLogGlobs find the daemon's container logs on a Kubernetes node.
var defaultLogGlobs = []string{"/var/log/pods/*_coordino-*/*/*.log"}

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

var bugtoolOpts struct {
	out  string
	logs multiFlag
}

func bugtoolFlags(fs *flag.FlagSet) {
	bugtoolOpts.logs = nil
	fs.StringVar(&bugtoolOpts.out, "output", "", "tarball to write (default coordino-bugtool-<node>-<time>.tar.gz in the current directory)")
	fs.Var(&bugtoolOpts.logs, "log-file", "a daemon log file to include, repeatable (default: the daemon's container logs under /var/log/pods)")
}

// runBugtool writes the daemon's diagnostics, the log files and version
// information into a gzipped tarball. Every file passes through
// inspectv1.Redact: WireGuard keys, tokens and passwords never reach it.
func runBugtool(ctx context.Context, c *client, _ []string) error {
	rctx, cancel := c.rpcContext(ctx)
	defer cancel()
	diag, err := c.inspect.CollectDiagnostics(rctx, &inspectv1.CollectDiagnosticsRequest{})
	if err != nil {
		return err
	}
	node := "node"
	if st, err := c.inspect.GetStatus(rctx, &inspectv1.GetStatusRequest{}); err == nil && st.NodeName != "" {
		node = st.NodeName
	}
	stamp := time.Now().UTC().Format("20060102T150405Z")
	out := bugtoolOpts.out
	if out == "" {
		out = fmt.Sprintf("coordino-bugtool-%s-%s.tar.gz", node, stamp)
	}
	dir := fmt.Sprintf("coordino-bugtool-%s-%s", node, stamp)
	f, err := os.OpenFile(out, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	gz := gzip.NewWriter(f)
	tw := tar.NewWriter(gz)
	add := func(name string, data []byte) error {
		data = inspectv1.Redact(data)
		if err := tw.WriteHeader(&tar.Header{Name: dir + "/" + name, Mode: 0o600, Size: int64(len(data)), ModTime: time.Now()}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	write := func() error {
		for _, df := range diag.Files {
			if err := add("daemon/"+filepath.Clean("/" + df.Name)[1:], df.Content); err != nil {
				return err
			}
		}
		if err := add("versions.txt", []byte(versions())); err != nil {
			return err
		}
		logs := bugtoolOpts.logs
		if len(logs) == 0 {
			for _, g := range defaultLogGlobs {
				m, _ := filepath.Glob(g)
				logs = append(logs, m...)
			}
		}
		for i, path := range logs {
			data, err := os.ReadFile(path)
			if err != nil {
				data = []byte(fmt.Sprintf("read %s: %v\n", path, err))
			}
			if err := add(fmt.Sprintf("logs/%d-%s", i, filepath.Base(path)), data); err != nil {
				return err
			}
		}
		return nil
	}
	err = write()
	if cerr := tw.Close(); err == nil {
		err = cerr
	}
	if cerr := gz.Close(); err == nil {
		err = cerr
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(out)
		return fmt.Errorf("write %s: %w", out, err)
	}
	fmt.Fprintln(c.out, out)
	return nil
}

func versions() string {
	var u unix.Utsname
	kernel := "unknown"
	if unix.Uname(&u) == nil {
		kernel = unix.ByteSliceToString(u.Release[:]) + " " + unix.ByteSliceToString(u.Version[:])
	}
	return fmt.Sprintf("coordinoctl: %s\nkernel: %s\narch: %s\n", clientVersion(), kernel, runtime.GOARCH)
}

// clientVersion is coordinoctl's module version and VCS revision.
func clientVersion() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	v := bi.Main.Version
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" && len(s.Value) >= 12 {
			v += " (" + s.Value[:12] + ")"
		}
	}
	return v + " " + bi.GoVersion
}
