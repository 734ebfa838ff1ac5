//go:build tools

// Package etcdbuild pins the etcd server the runtime test bed builds. It lives
// in its own module so the project's go.mod never pulls etcd; build.sh builds
// from here.
package etcdbuild

import (
	_ "go.etcd.io/etcd/server/v3"
)
