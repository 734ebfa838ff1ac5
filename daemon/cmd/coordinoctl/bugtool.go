package main

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"flag"
	"fmt"
	"io"
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
	now := time.Now()
	stamp := now.UTC().Format("20060102T150405Z")
	out := bugtoolOpts.out
	if out == "" {
		out = fmt.Sprintf("coordino-bugtool-%s-%s.tar.gz", node, stamp)
	}
	f, err := os.OpenFile(out, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	tb := newTarball(f, fmt.Sprintf("coordino-bugtool-%s-%s", node, stamp), now)
	write := func() error {
		for _, df := range diag.Files {
			if err := tb.add("daemon/"+filepath.Clean("/" + df.Name)[1:], df.Content); err != nil {
				return err
			}
		}
		if err := tb.add("versions.txt", []byte(versions())); err != nil {
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
			if err := tb.add(fmt.Sprintf("logs/%d-%s", i, filepath.Base(path)), data); err != nil {
				return err
			}
		}
		return nil
	}
	err = write()
	if cerr := tb.close(); err == nil {
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

// tarball is a gzipped tar of redacted files under one directory.
type tarball struct {
	gz    *gzip.Writer
	tw    *tar.Writer
	dir   string
	mtime time.Time
}

// newTarball stamps every entry with now cut to the second: tar keeps whole
// seconds and would round up to half a second into the future otherwise,
// which tar warns about on extraction.
func newTarball(w io.Writer, dir string, now time.Time) *tarball {
	gz := gzip.NewWriter(w)
	return &tarball{gz: gz, tw: tar.NewWriter(gz), dir: dir, mtime: now.Truncate(time.Second)}
}

// add writes one file after inspectv1.Redact.
func (t *tarball) add(name string, data []byte) error {
	data = inspectv1.Redact(data)
	if err := t.tw.WriteHeader(&tar.Header{Name: t.dir + "/" + name, Mode: 0o600, Size: int64(len(data)), ModTime: t.mtime}); err != nil {
		return err
	}
	_, err := t.tw.Write(data)
	return err
}

func (t *tarball) close() error {
	err := t.tw.Close()
	if gerr := t.gz.Close(); err == nil {
		err = gerr
	}
	return err
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
