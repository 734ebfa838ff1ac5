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

	synced     chan struct{}
	syncedOnce sync.Once
	files      map[string]*Objects // last valid content per file name
	broken     map[string]string   // file name → current parse error

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
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".") || !isPolicyFile(name) {
			continue
		}
		path := filepath.Join(s.dir, name)
		if st, err := os.Stat(path); err != nil || st.IsDir() {
			continue
		}
		seen[name] = true
		objs, err := readPolicyFile(path)
		if err != nil {
			s.fileErrors.Inc()
			if s.broken[name] != err.Error() {
				s.log.Error("invalid policy file ignored; its last valid content stays in force",
					zap.String("file", path), zap.Error(err))
			}
			s.broken[name] = err.Error()
			continue
		}
		delete(s.broken, name)
		s.files[name] = objs
	}
	for name := range s.files {
		if !seen[name] {
			delete(s.files, name)
		}
	}
	for name := range s.broken {
		if !seen[name] {
			delete(s.broken, name)
		}
	}
	s.invalid.Set(float64(len(s.broken)))

	snap := s.snapshot()
	if err := sink.UpdatePolicy(snap); err != nil {
		s.sinkErrors.Inc()
		s.log.Warn("datapath reported policy errors", zap.Error(err))
	}
	s.log.Info("policy loaded", zap.Int("policies", len(snap.Policies)), zap.Int("namespaces", len(snap.Namespaces)),
		zap.Int("invalidFiles", len(s.broken)))
	s.syncedOnce.Do(func() { close(s.synced) })
	return nil
}

func readPolicyFile(path string) (*Objects, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("policy file %q: %w", path, err)
	}
	defer f.Close()
	// Read one byte past the limit so ParseFile can reject oversized files.
	data, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("policy file %q: %w", path, err)
	}
	return ParseFile(filepath.Base(path), data)
}

// snapshot merges files in name order; a later duplicate of namespace/name
// is dropped with a warning so the result does not depend on map order.
func (s *Standalone) snapshot() policy.Snapshot {
	var snap policy.Snapshot
	seenNP, seenNS := map[string]string{}, map[string]string{}
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
		for _, ns := range objs.Namespaces {
			if first, dup := seenNS[ns.Name]; dup {
				s.log.Warn("duplicate Namespace ignored", zap.String("namespace", ns.Name), zap.String("file", name), zap.String("first", first))
				continue
			}
			seenNS[ns.Name] = name
			snap.Namespaces = append(snap.Namespaces, ns)
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
