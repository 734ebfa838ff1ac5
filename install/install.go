package install

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"sync/atomic"
	"syscall"

	"go.uber.org/zap"

	"github.com/coordino/coordino/conflist"
)

// Mode says how Coordino sits in the node's CNI chain.
type Mode string

const (
	// ModePrimary makes Coordino the node's only CNI, with its own conflist.
	ModePrimary Mode = "primary"
	// ModeChained appends Coordino to the chain of the node's existing CNI.
	ModeChained Mode = "chained"
)

// Defaults for Config fields left empty.
const (
	DefaultBinDir          = "/opt/cni/bin"
	DefaultConfDir         = "/etc/cni/net.d"
	DefaultPluginSource    = "/opt/coordino/bin/coordino"
	DefaultPrimaryPriority = "10"
	DefaultChainedPriority = "00"
)

// PluginBinary is the file name of the plugin in the CNI bin dir; runtimes
// find it through the "type" of its conflist entry.
const PluginBinary = conflist.PluginType

// lockName is the installer's lock file in the conf dir; the dot and the
// missing config extension keep runtimes from reading it.
const lockName = ".coordino-install.lock"

// ownFile matches every config file name the installer may have written, in
// either mode and at any priority, so Uninstall and mode switches find them.
var ownFile = regexp.MustCompile(`^[0-9]+-coordino(-chained)?\.conflist$`)

// priorityRE is what a priority may look like: it is a file name prefix.
var priorityRE = regexp.MustCompile(`^[0-9]{1,4}$`)

// ErrNoPrimary means chained mode found no other CNI config to chain onto.
var ErrNoPrimary = errors.New("no primary CNI config found to chain onto")

// Config is what the installer is told to do; zero fields take the defaults.
type Config struct {
	BinDir       string // host CNI bin dir
	ConfDir      string // host CNI conf dir
	PluginSource string // the coordino plugin binary to copy; empty skips the copy
	// PortMapSource is the portmap plugin binary to copy when the primary
	// conflist chains it (Conflist.PortMap); empty skips the copy.
	PortMapSource string
	Mode          Mode
	// Priority is the numeric prefix of the file the installer writes:
	// "<priority>-coordino.conflist" (primary) or
	// "<priority>-coordino-chained.conflist" (chained).
	Priority string
	// Conflist sets name and cniVersion (primary mode only; chained keeps the
	// primary's) and the knobs of Coordino's plugin entry (both modes).
	Conflist conflist.Options
	// Log receives progress and warnings; nil discards them.
	Log *zap.Logger
	// NodeState, if set, makes Uninstall also remove the daemon's datapath
	// programs, BPF pins and netns pins (see RemoveNodeState).
	NodeState *NodeState
}

// Installer installs, maintains and removes Coordino on one node.
type Installer struct {
	cfg    Config
	log    *zap.Logger
	writes atomic.Int64
}

// New checks cfg, fills in defaults and returns an Installer.
func New(cfg Config) (*Installer, error) {
	if cfg.BinDir == "" {
		cfg.BinDir = DefaultBinDir
	}
	if cfg.ConfDir == "" {
		cfg.ConfDir = DefaultConfDir
	}
	switch cfg.Mode {
	case "":
		cfg.Mode = ModePrimary
	case ModePrimary, ModeChained:
	default:
		return nil, fmt.Errorf("mode: %q is not primary or chained", cfg.Mode)
	}
	if cfg.Priority == "" {
		cfg.Priority = DefaultPrimaryPriority
		if cfg.Mode == ModeChained {
			cfg.Priority = DefaultChainedPriority
		}
	}
	if !priorityRE.MatchString(cfg.Priority) {
		return nil, fmt.Errorf("priority: %q is not 1 to 4 digits", cfg.Priority)
	}
	if _, err := conflist.Build(cfg.Conflist); err != nil {
		return nil, fmt.Errorf("conflist options: %w", err)
	}
	log := cfg.Log
	if log == nil {
		log = zap.NewNop()
	}
	return &Installer{cfg: cfg, log: log}, nil
}

// ConfPath returns the path of the config file this installer maintains.
func (in *Installer) ConfPath() string {
	name := in.cfg.Priority + "-coordino.conflist"
	if in.cfg.Mode == ModeChained {
		name = in.cfg.Priority + "-coordino-chained.conflist"
	}
	return filepath.Join(in.cfg.ConfDir, name)
}

// Writes returns how many files the installer has replaced or removed so far;
// a no-op reconcile does not count.
func (in *Installer) Writes() int64 { return in.writes.Load() }

// Install copies the plugin (if it differs) and writes or updates the config
// for the mode (if it differs). In chained mode it returns ErrNoPrimary when
// there is nothing to chain onto, after removing a stale chained file.
func (in *Installer) Install() error {
	unlock, err := in.lock()
	if err != nil {
		return err
	}
	defer unlock()
	if err := removeTemps(in.cfg.BinDir); err != nil {
		return err
	}
	if err := removeTemps(in.cfg.ConfDir); err != nil {
		return err
	}
	if err := in.copyPlugin(); err != nil {
		return err
	}
	// Before the config: runtimes must find every plugin it names.
	if err := in.copyPortMap(); err != nil {
		return err
	}
	return in.reconcileLocked()
}

// Reconcile brings the config file in line with the mode and, in chained
// mode, with the current primary config. It never touches the plugin binary.
func (in *Installer) Reconcile() error {
	unlock, err := in.lock()
	if err != nil {
		return err
	}
	defer unlock()
	return in.reconcileLocked()
}

func (in *Installer) reconcileLocked() error {
	target := in.ConfPath()
	want, perm, err := in.desiredConfig()
	if errors.Is(err, ErrNoPrimary) {
		// A chain without its primary is stale: runtimes must not use it.
		if err := in.removeOwnConfigs(""); err != nil {
			return err
		}
		return err
	}
	if err != nil {
		return err
	}
	if same, err := fileHasContent(target, want, perm); err != nil {
		return err
	} else if !same {
		if err := writeAtomic(target, bytes.NewReader(want), perm); err != nil {
			return err
		}
		in.writes.Add(1)
		in.log.Info("wrote CNI config", zap.String("path", target), zap.String("mode", string(in.cfg.Mode)))
	}
	// Written before removing the old ones so runtimes never see a gap.
	if err := in.removeOwnConfigs(filepath.Base(target)); err != nil {
		return err
	}
	if in.cfg.Mode == ModePrimary {
		in.warnIfShadowed(filepath.Base(target))
	}
	return nil
}

// primaryConfigMode is the mode of the conflist written in primary mode.
const primaryConfigMode fs.FileMode = 0o644

// desiredConfig returns the config file to write and its mode. A chained
// config copies the primary's file, which may be private (0600: it can name
// credentials), so it gets the primary file's mode.
func (in *Installer) desiredConfig() ([]byte, fs.FileMode, error) {
	if in.cfg.Mode == ModePrimary {
		data, err := conflist.Build(in.cfg.Conflist)
		return data, primaryConfigMode, err
	}
	p, err := FindPrimary(in.cfg.ConfDir, func(path string, err error) {
		in.log.Warn("skipping invalid CNI config", zap.String("path", path), zap.Error(err))
	})
	if err != nil {
		return nil, 0, err
	}
	if p == nil {
		return nil, 0, fmt.Errorf("%w in %s", ErrNoPrimary, in.cfg.ConfDir)
	}
	if name := filepath.Base(in.ConfPath()); name >= filepath.Base(p.Path) {
		return nil, 0, fmt.Errorf("chain onto %s: %s would not sort before it, so runtimes would ignore it; use a lower priority", p.Path, name)
	}
	out, _, err := conflist.InsertCoordino(p.Data, p.Path, in.cfg.Conflist.Knobs)
	if err != nil {
		return nil, 0, fmt.Errorf("chain onto %s: %w", p.Path, err)
	}
	return out, p.Mode, nil
}

// removeOwnConfigs removes every config file of ours except keep.
func (in *Installer) removeOwnConfigs(keep string) error {
	entries, err := os.ReadDir(in.cfg.ConfDir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("list %s: %w", in.cfg.ConfDir, err)
	}
	for _, e := range entries {
		if e.Name() == keep || !ownFile.MatchString(e.Name()) {
			continue
		}
		path := filepath.Join(in.cfg.ConfDir, e.Name())
		removed, err := removeDurably(path)
		if err != nil {
			return err
		}
		if removed {
			in.writes.Add(1)
			in.log.Info("removed CNI config", zap.String("path", path))
		}
	}
	return nil
}

// warnIfShadowed logs when another valid config sorts before ours: runtimes
// use the first one, so Coordino would not be the node's CNI.
func (in *Installer) warnIfShadowed(ours string) {
	p, err := FindPrimary(in.cfg.ConfDir, nil)
	if err == nil && p != nil && filepath.Base(p.Path) < ours {
		in.log.Warn("another CNI config sorts first; runtimes will use it instead of Coordino", zap.String("path", p.Path), zap.String("ours", ours))
	}
}

func (in *Installer) copyPlugin() error {
	if in.cfg.PluginSource == "" {
		return nil
	}
	return in.copyBinary(in.cfg.PluginSource, filepath.Join(in.cfg.BinDir, PluginBinary), "plugin-source")
}

// copyBinary replaces dst with an executable copy of src unless it already
// is one; flag names src in errors.
func (in *Installer) copyBinary(srcPath, dst, flag string) error {
	same, err := sameFiles(srcPath, dst)
	if err != nil {
		return fmt.Errorf("%s: %w", flag, err)
	}
	if same {
		return nil
	}
	src, err := os.Open(srcPath)
	if err != nil {
		return fmt.Errorf("%s: %w", flag, err)
	}
	defer src.Close()
	if err := writeAtomic(dst, src, 0o755); err != nil {
		return err
	}
	in.writes.Add(1)
	in.log.Info("installed CNI plugin", zap.String("path", dst), zap.String("from", srcPath))
	return nil
}

// Uninstall removes every config file the installer may have written (either
// mode, any priority), then with Config.NodeState the daemon's datapath and
// pins, then the plugin binary, a portmap it installed, and the installer's
// leftovers. The
// primary CNI's files are never written, so they stay as they were.
func (in *Installer) Uninstall() error {
	unlock, err := in.lock()
	if err != nil {
		return err
	}
	defer unlock()
	if err := in.removeOwnConfigs(""); err != nil {
		return err
	}
	// Configs first: no runtime hands Coordino a new pod while it goes.
	if in.cfg.NodeState != nil {
		if err := RemoveNodeState(*in.cfg.NodeState, in.log); err != nil {
			return err
		}
	}
	if err := removeTemps(in.cfg.ConfDir); err != nil {
		return err
	}
	if err := removeTemps(in.cfg.BinDir); err != nil {
		return err
	}
	bin := filepath.Join(in.cfg.BinDir, PluginBinary)
	if removed, err := removeDurably(bin); err != nil {
		return err
	} else if removed {
		in.writes.Add(1)
		in.log.Info("removed CNI plugin", zap.String("path", bin))
	}
	if err := in.removePortMap(); err != nil {
		return err
	}
	// Removing the lock file while holding it is safe: a waiter that then
	// gets it finds nothing of ours left to do.
	if _, err := removeDurably(filepath.Join(in.cfg.ConfDir, lockName)); err != nil {
		return err
	}
	return nil
}

// lock serialises installers on one node (the init container, the watcher
// and an uninstall pod may overlap) with an flock in the conf dir.
func (in *Installer) lock() (unlock func(), err error) {
	if err := os.MkdirAll(in.cfg.ConfDir, 0o755); err != nil {
		return nil, fmt.Errorf("create %s: %w", in.cfg.ConfDir, err)
	}
	if err := os.MkdirAll(in.cfg.BinDir, 0o755); err != nil {
		return nil, fmt.Errorf("create %s: %w", in.cfg.BinDir, err)
	}
	path := filepath.Join(in.cfg.ConfDir, lockName)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return func() { f.Close() }, nil // closing drops the flock
}

// Primary is the config file a runtime would use, and its content.
type Primary struct {
	Path string
	Data []byte
	Mode fs.FileMode // permission bits of the file
}

// FindPrimary returns the config a runtime would load from confDir, ignoring
// the installer's own files: the lexically first .conf, .conflist or .json
// file that is a valid config (libcni's file set, CRI-O's skip-invalid rule).
// It returns nil and no error when there is none. skip, if not nil, is told
// about each invalid file passed over.
func FindPrimary(confDir string, skip func(path string, err error)) (*Primary, error) {
	entries, err := os.ReadDir(confDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", confDir, err)
	}
	var names []string
	for _, e := range entries {
		if !e.IsDir() && conflist.IsConfigFile(e.Name()) && !ownFile.MatchString(e.Name()) {
			names = append(names, e.Name())
		}
	}
	sort.Strings(names)
	for _, name := range names {
		path := filepath.Join(confDir, name)
		data, mode, err := readWithMode(path)
		if err == nil {
			_, err = conflist.Parse(data, path)
		}
		if err != nil {
			if skip != nil {
				skip(path, err)
			}
			continue
		}
		return &Primary{Path: path, Data: data, Mode: mode}, nil
	}
	return nil, nil
}
