// Package atomicfile writes the daemon's small state files so that a crash
// or power loss leaves either the old content or the new, never a torn file.
package atomicfile
