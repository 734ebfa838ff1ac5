package install

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/coordino/coordino/conflist"
)

// DefaultPortMapSource is where the image holds the reference portmap plugin.
const DefaultPortMapSource = "/opt/coordino/bin/portmap"

// portMapRecord, in the bin dir, lists the SHA-256 of every portmap the
// installer has put there. A portmap whose hash is listed is ours: updated on
// install, removed on uninstall. Any other portmap is the host's (its CNI
// plugins package, another CNI) and is never replaced or removed. The dot
// keeps runtimes from taking it for a plugin.
const portMapRecord = ".coordino-portmap.sha256"

// usesPortMap reports whether the config this installer writes chains portmap.
func (in *Installer) usesPortMap() bool {
	return in.cfg.Mode == ModePrimary && in.cfg.Conflist.PortMap && in.cfg.PortMapSource != ""
}

// copyPortMap puts portmap into the bin dir when the conflist uses it and
// the bin dir has none, or has an older one of ours. The hash is recorded
// before the binary is written, so a crash in between never leaves a binary
// of ours that looks like the host's.
func (in *Installer) copyPortMap() error {
	if !in.usesPortMap() {
		return nil
	}
	dst := filepath.Join(in.cfg.BinDir, conflist.PortMapType)
	want, err := fileSHA256(in.cfg.PortMapSource)
	if err != nil {
		return fmt.Errorf("portmap-source: %w", err)
	}
	ours, err := in.portMapHashes()
	if err != nil {
		return err
	}
	have, err := fileSHA256(dst)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return err
	case !slices.Contains(ours, have):
		in.log.Info("keeping the host's portmap plugin", zap.String("path", dst))
		return in.checkHostPortMap(dst)
	}
	if !slices.Contains(ours, want) {
		rec := []byte(strings.Join(append(ours, want), "\n") + "\n")
		if err := writeAtomic(filepath.Join(in.cfg.BinDir, portMapRecord), bytes.NewReader(rec), 0o644); err != nil {
			return err
		}
	}
	return in.copyBinary(in.cfg.PortMapSource, dst, "portmap-source")
}

// checkHostPortMap fails when the host's portmap refuses the conflist's
// cniVersion: it would fail every pod's ADD, with or without hostPorts. It
// asks the plugin as runtimes do (CNI_COMMAND=VERSION); a portmap that cannot
// be asked from here (say, dynamically linked, run from this scratch image)
// is only warned about.
func (in *Installer) checkHostPortMap(path string) error {
	want := in.cfg.Conflist.CNIVersion
	if want == "" {
		want = conflist.DefaultCNIVersion
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, path)
	cmd.Env = []string{"CNI_COMMAND=VERSION"}
	cmd.Stdin = strings.NewReader(`{"cniVersion":` + strconv.Quote(want) + `}`)
	out, err := cmd.Output()
	var v struct {
		Supported []string `json:"supportedVersions"`
	}
	if err == nil {
		err = json.Unmarshal(out, &v)
	}
	if err != nil {
		in.log.Warn("cannot ask the host's portmap which cniVersions it supports; pods fail if it refuses the conflist's", zap.String("path", path), zap.String("cniVersion", want), zap.Error(err))
		return nil
	}
	if !slices.Contains(v.Supported, want) {
		return fmt.Errorf("the host's portmap %s supports cniVersion %v, not %s of Coordino's conflist, so every pod would fail: update it, remove it (the installer then puts its own), set --cni-version to one it supports, or --portmap=false", path, v.Supported, want)
	}
	return nil
}

// removePortMap removes portmap if it is one the installer put there, then
// the record.
func (in *Installer) removePortMap() error {
	ours, err := in.portMapHashes()
	if err != nil || ours == nil {
		return err
	}
	bin := filepath.Join(in.cfg.BinDir, conflist.PortMapType)
	have, err := fileSHA256(bin)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err == nil && slices.Contains(ours, have) {
		if _, err := removeDurably(bin); err != nil {
			return err
		}
		in.writes.Add(1)
		in.log.Info("removed CNI plugin", zap.String("path", bin))
	}
	_, err = removeDurably(filepath.Join(in.cfg.BinDir, portMapRecord))
	return err
}

// portMapHashes returns the hashes in the record; nil when there is none.
func (in *Installer) portMapHashes() ([]string, error) {
	data, err := os.ReadFile(filepath.Join(in.cfg.BinDir, portMapRecord))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read portmap record: %w", err)
	}
	return strings.Fields(string(data)), nil
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
