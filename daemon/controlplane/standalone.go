package controlplane

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/coordino/coordino/daemon/policy"
	"github.com/fsnotify/fsnotify"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// DefaultDebounce is how long Standalone waits for a burst of file changes
// to settle before reloading; well inside the 2 s the daemon promises.
const DefaultDebounce = 250 * time.Millisecond

// Standalone is the Source of standalone mode: every *.yaml, *.yml and
// *.json file of a directory. A file that stops parsing keeps its last valid
// content (and is reported), so a bad edit never opens traffic.
type Standalone struct {
	dir      string
	log      *zap.Logger
	debounce time.Duration

	// StateDir, when set before Run, keeps a copy of every policy file's
	// last valid content there, so a file that is broken when the daemon
	// (re)starts keeps enforcing its last valid version.
	StateDir string

	synced     chan struct{}
	syncedOnce sync.Once
	files      map[string]*Objects  // last valid content per file name
	broken     map[string]string    // file name → current parse error
	stamps     map[string]fileStamp // file name → what was last read
	swept      bool                 // saved copies of vanished files removed

	reloads    prometheus.Counter
	fileErrors prometheus.Counter
	invalid    prometheus.Gauge
	sinkErrors prometheus.Counter
}

// NewStandalone returns a source watching dir; log may be nil.
func NewStandalone(dir string, log *zap.Logger) *Standalone {
	if log == nil {
		log = zap.NewNop()
	}
	return &Standalone{
		dir:      dir,
		log:      log.Named("policy-dir"),
		debounce: DefaultDebounce,
		synced:   make(chan struct{}),
		files:    map[string]*Objects{},
		broken:   map[string]string{},
		stamps:   map[string]fileStamp{},
		reloads: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "coordino_policy_dir_reloads_total", Help: "Reloads of the policy directory."}),
		fileErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "coordino_policy_file_errors_total", Help: "Policy files that failed to parse, counted per reload."}),
		invalid: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "coordino_policy_files_invalid", Help: "Policy files currently failing to parse (last valid content in force)."}),
		sinkErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "coordino_policy_apply_errors_total", Help: "Snapshots the datapath reported errors for."}),
	}
}

// Collectors returns the source's Prometheus collectors.
func (s *Standalone) Collectors() []prometheus.Collector {
	return []prometheus.Collector{s.reloads, s.fileErrors, s.invalid, s.sinkErrors}
}

// Synced is closed after the first snapshot was delivered.
func (s *Standalone) Synced() <-chan struct{} { return s.synced }

// Errors returns the current parse error of each broken file.
func (s *Standalone) Errors() map[string]string { return maps.Clone(s.broken) }

var _ Source[Sink] = (*Standalone)(nil)

// Run loads the directory, delivers it, and redelivers after each change.
func (s *Standalone) Run(ctx context.Context, sink Sink) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("policy dir %q: watch: %w", s.dir, err)
	}
	defer w.Close()
	if err := w.Add(s.dir); err != nil {
		return fmt.Errorf("policy dir %q: watch: %w", s.dir, err)
	}
	if err := s.reload(sink); err != nil {
		return err
	}
	timer := time.NewTimer(0)
	<-timer.C
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return errors.New("policy dir watcher closed")
			}
			s.log.Debug("policy dir changed", zap.String("event", ev.String()))
			timer.Reset(s.debounce)
		case err, ok := <-w.Errors:
			if !ok {
				return errors.New("policy dir watcher closed")
			}
			// Overflow loses events: a full reload recovers.
			s.log.Warn("policy dir watch error", zap.Error(err))
			timer.Reset(s.debounce)
		case <-timer.C:
			if err := s.reload(sink); err != nil {
				s.log.Error("policy dir reload failed", zap.Error(err))
			}
		}
	}
}

// reload reads every policy file, keeps the last valid content of broken
// ones, and hands the merged snapshot to sink.
func (s *Standalone) reload(sink Sink) error {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return fmt.Errorf("policy dir %q: %w", s.dir, err)
	}
	s.reloads.Inc()
	seen := map[string]bool{}
	save := map[string][]byte{} // new last valid content (nil: file deleted)
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".") || !isPolicyFile(name) {
			continue
		}
		path := filepath.Join(s.dir, name)
		st, err := os.Stat(path)
		if err != nil || st.IsDir() {
			continue
		}
		seen[name] = true
		stamp := stampOf(st)
		if old, ok := s.stamps[name]; ok && old == stamp {
			// Unchanged since it was last read: keep the parsed objects as
			// they are, so the datapath sees identical pointers.
			if _, bad := s.broken[name]; bad {
				s.fileErrors.Inc()
			}
			continue
		}
		s.stamps[name] = stamp
		data, objs, err := readPolicyFile(path)
		if err != nil {
			s.fileErrors.Inc()
			if s.broken[name] != err.Error() {
				s.log.Error("invalid policy file ignored; its last valid content stays in force",
					zap.String("file", path), zap.Error(err))
			}
			s.broken[name] = err.Error()
			if _, known := s.files[name]; !known {
				s.restoreLastValid(name)
			}
			continue
		}
		delete(s.broken, name)
		s.files[name] = objs
		save[name] = data
	}
	for name := range s.files {
		if !seen[name] {
			delete(s.files, name)
			save[name] = nil
		}
	}
	for name := range s.broken {
		if !seen[name] {
			delete(s.broken, name)
		}
	}
	for name := range s.stamps {
		if !seen[name] {
			delete(s.stamps, name)
		}
	}
	s.sweepSaved(seen)
	s.invalid.Set(float64(len(s.broken)))

	snap := s.snapshot()
	if err := sink.UpdatePolicy(snap); err != nil {
		s.sinkErrors.Inc()
		s.log.Warn("datapath reported policy errors", zap.Error(err))
	}
	s.log.Info("policy loaded", zap.Int("policies", len(snap.Policies)), zap.Int("namespaces", len(snap.Namespaces)),
		zap.Int("invalidFiles", len(s.broken)))
	s.syncedOnce.Do(func() { close(s.synced) })
	// After applying: the fsyncs do not delay enforcement.
	s.saveLastValid(save)
	return nil
}

// saveLastValid records the new last valid content of changed files.
func (s *Standalone) saveLastValid(save map[string][]byte) {
	if s.StateDir == "" {
		return
	}
	for name, data := range save {
		var err error
		if data == nil {
			err = s.last().remove(name)
		} else {
			err = s.last().save(name, data)
		}
		if err != nil {
			s.log.Error("cannot keep the last valid policy file in the state dir", zap.String("file", name), zap.Error(err))
		}
	}
}

func readPolicyFile(path string) ([]byte, *Objects, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, fmt.Errorf("policy file %q: %w", path, err)
	}
	defer f.Close()
	// Read one byte past the limit so ParseFile can reject oversized files.
	data, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return nil, nil, fmt.Errorf("policy file %q: %w", path, err)
	}
	objs, err := ParseFile(filepath.Base(path), data)
	return data, objs, err
}

func (s *Standalone) last() lastValid { return lastValid{dir: s.StateDir} }

// restoreLastValid puts the saved copy of a broken file in force: the file
// was broken before this process ever read a valid version of it.
func (s *Standalone) restoreLastValid(name string) {
	if s.StateDir == "" {
		return
	}
	data, err := s.last().load(name)
	if err != nil || data == nil {
		if err != nil {
			s.log.Error("cannot read the saved copy of a broken policy file", zap.String("file", name), zap.Error(err))
		}
		return
	}
	objs, err := ParseFile(name, data)
	if err != nil {
		s.log.Error("saved copy of a broken policy file is invalid too", zap.String("file", name), zap.Error(err))
		return
	}
	s.files[name] = objs
	s.log.Warn("policy file broken; enforcing its last valid content saved in the state dir",
		zap.String("file", filepath.Join(s.dir, name)), zap.String("copy", s.last().path(name)))
}

// sweepSaved removes, once, saved copies of files deleted from the policy
// dir while the daemon was not running.
func (s *Standalone) sweepSaved(seen map[string]bool) {
	if s.StateDir == "" || s.swept {
		return
	}
	s.swept = true
	names, err := s.last().names()
	if err != nil {
		s.log.Error("cannot list saved policy files", zap.Error(err))
		return
	}
	for _, name := range names {
		if !seen[name] {
			if err := s.last().remove(name); err != nil {
				s.log.Error("cannot remove a saved policy file", zap.String("file", name), zap.Error(err))
			}
		}
	}
}

// snapshot merges files in name order; a later duplicate of namespace/name
// is dropped with a warning so the result does not depend on map order.
func (s *Standalone) snapshot() policy.Snapshot {
	var snap policy.Snapshot
	seenNP, seenNS, seenNIP, seenCNP, seenNode := map[string]string{}, map[string]string{}, map[string]string{}, map[string]string{}, map[string]string{}
	for _, name := range slices.Sorted(maps.Keys(s.files)) {
		objs := s.files[name]
		for _, np := range objs.Policies {
			id := np.Namespace + "/" + np.Name
			if first, dup := seenNP[id]; dup {
				s.log.Warn("duplicate NetworkPolicy ignored", zap.String("policy", id), zap.String("file", name), zap.String("first", first))
				continue
			}
			seenNP[id] = name
			snap.Policies = append(snap.Policies, np)
		}
		for _, cnp := range objs.ClusterPolicies {
			if first, dup := seenCNP[cnp.Name]; dup {
				s.log.Warn("duplicate ClusterNetworkPolicy ignored", zap.String("policy", cnp.Name), zap.String("file", name), zap.String("first", first))
				continue
			}
			seenCNP[cnp.Name] = name
			snap.ClusterPolicies = append(snap.ClusterPolicies, cnp)
		}
		for _, ns := range objs.Namespaces {
			if first, dup := seenNS[ns.Name]; dup {
				s.log.Warn("duplicate Namespace ignored", zap.String("namespace", ns.Name), zap.String("file", name), zap.String("first", first))
				continue
			}
			seenNS[ns.Name] = name
			snap.Namespaces = append(snap.Namespaces, ns)
		}
		for _, nip := range objs.NodeIsolation {
			if first, dup := seenNIP[nip.Name]; dup {
				s.log.Warn("duplicate NodeIsolationPolicy ignored", zap.String("policy", nip.Name), zap.String("file", name), zap.String("first", first))
				continue
			}
			seenNIP[nip.Name] = name
			snap.NodeIsolation = append(snap.NodeIsolation, nip)
		}
		for _, n := range objs.Nodes {
			if first, dup := seenNode[n.Name]; dup {
				s.log.Warn("duplicate Node ignored", zap.String("node", n.Name), zap.String("file", name), zap.String("first", first))
				continue
			}
			seenNode[n.Name] = name
			snap.Nodes = append(snap.Nodes, n)
		}
	}
	return snap
}

func isPolicyFile(name string) bool {
	switch strings.ToLower(filepath.Ext(name)) {
	case ".yaml", ".yml", ".json":
		return true
	}
	return false
}
