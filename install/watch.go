package install

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"
	"go.uber.org/zap"

	"github.com/coordino/coordino/conflist"
)

// WatchOptions tune Watch; zero fields take the defaults.
type WatchOptions struct {
	// Debounce is how long the conf dir must be quiet before reconciling, so
	// a CNI that writes its file in several steps is read once, complete.
	Debounce time.Duration
	// MaxDelay bounds how long a stream of events can postpone a reconcile.
	MaxDelay time.Duration
	// Resync reconciles this often even without events, in case one was missed.
	Resync time.Duration
	// Ready, if not nil, is called once the watch is set up and the first
	// install is done.
	Ready func()
}

// Watch installs, then keeps the config right until ctx ends: when any CNI
// config in the conf dir is created, rewritten or removed (including ours) it
// reconciles after the dir has been quiet for Debounce. Reconciling writes
// only when the content differs, and never writes another CNI's file, so it
// cannot start a write loop with a CNI that watches its own file.
func (in *Installer) Watch(ctx context.Context, opts WatchOptions) error {
	if opts.Debounce <= 0 {
		opts.Debounce = 500 * time.Millisecond
	}
	if opts.MaxDelay <= 0 {
		opts.MaxDelay = 10 * opts.Debounce
	}
	if opts.Resync <= 0 {
		opts.Resync = 5 * time.Minute
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watch %s: %w", in.cfg.ConfDir, err)
	}
	defer w.Close()
	// Create the dir and watch it before the first install, so no rewrite
	// between the two goes unseen.
	unlock, err := in.lock()
	if err != nil {
		return err
	}
	unlock()
	if err := w.Add(in.cfg.ConfDir); err != nil {
		return fmt.Errorf("watch %s: %w", in.cfg.ConfDir, err)
	}
	if err := in.Install(); err != nil {
		if !errors.Is(err, ErrNoPrimary) {
			return err
		}
		in.log.Warn("waiting for a primary CNI config", zap.String("dir", in.cfg.ConfDir))
	}
	if opts.Ready != nil {
		opts.Ready()
	}

	resync := time.NewTicker(opts.Resync)
	defer resync.Stop()
	debounce := time.NewTimer(time.Hour)
	debounce.Stop()
	var pendingSince time.Time // zero when no reconcile is pending
	reconcile := func() {
		pendingSince = time.Time{}
		if err := in.Reconcile(); err != nil {
			in.log.Error("reconcile CNI config", zap.Error(err))
		}
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return fmt.Errorf("watch %s: watcher closed", in.cfg.ConfDir)
			}
			if !conflist.IsConfigFile(filepath.Base(ev.Name)) {
				continue // our temp and lock files, editors' backups
			}
			now := time.Now()
			if pendingSince.IsZero() {
				pendingSince = now
			}
			if now.Sub(pendingSince) >= opts.MaxDelay {
				debounce.Stop()
				reconcile()
				continue
			}
			debounce.Reset(opts.Debounce)
		case err, ok := <-w.Errors:
			if !ok {
				return fmt.Errorf("watch %s: watcher closed", in.cfg.ConfDir)
			}
			// On overflow events were lost: look at the dir as it is now.
			in.log.Warn("watch error; reconciling", zap.String("dir", in.cfg.ConfDir), zap.Error(err))
			reconcile()
		case <-debounce.C:
			reconcile()
		case <-resync.C:
			reconcile()
		}
	}
}
