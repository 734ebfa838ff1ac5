package peers

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"
	"go.uber.org/zap"
)

// Source feeds the complete node set (this node included) to apply, once at
// start and again after every change, until ctx is done. The peers file is
// one implementation; a NodeConfig informer is the other: on any event it
// lists the NodeConfigs and passes the set built from them.
type Source interface {
	Run(ctx context.Context, apply func(Set)) error
}

// debounce coalesces the several events of one editor save or rename.
const debounce = 100 * time.Millisecond

// File is the standalone Source: a peers file the operator distributes to
// every node, watched for changes. A file that does not parse is reported
// and ignored, so a half-written file never withdraws routes.
type File struct {
	Path string
	Log  *zap.Logger
}

// Load reads the file once; a missing file is an empty set.
func (f *File) Load() (Set, error) {
	data, err := os.ReadFile(f.Path)
	if errors.Is(err, fs.ErrNotExist) {
		return Set{}, nil
	}
	if err != nil {
		return nil, err
	}
	s, err := ParseFile(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", f.Path, err)
	}
	return s, nil
}

// Run implements Source. It watches the directory so atomic renames over
// the file are seen.
func (f *File) Run(ctx context.Context, apply func(Set)) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return err
	}
	defer w.Close()
	if err := w.Add(filepath.Dir(f.Path)); err != nil {
		return fmt.Errorf("watch %s: %w", filepath.Dir(f.Path), err)
	}
	var last Set
	load := func() {
		s, err := f.Load()
		if err != nil {
			f.Log.Error("peers file ignored; keeping the previous peers", zap.Error(err))
			return
		}
		if last != nil && equalSets(last, s) {
			return
		}
		last = s
		f.Log.Info("peers file loaded", zap.String("path", f.Path), zap.Int("nodes", len(s)))
		apply(s)
	}
	load()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev := <-w.Events:
			if filepath.Clean(ev.Name) == filepath.Clean(f.Path) {
				timer.Reset(debounce)
			}
		case err := <-w.Errors:
			f.Log.Error("peers file watch", zap.Error(err))
		case <-timer.C:
			load()
		}
	}
}

func equalSets(a, b Set) bool {
	if len(a) != len(b) {
		return false
	}
	for name, n := range a {
		o, ok := b[name]
		if !ok || !n.Equal(o) {
			return false
		}
	}
	return true
}
