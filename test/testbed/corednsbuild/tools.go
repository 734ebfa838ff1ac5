//go:build tools

// Package corednsbuild pins the CoreDNS server the multi-node test bed runs as
// the cluster DNS. It lives in its own module so the project's go.mod never
// pulls CoreDNS; build.sh builds from here.
package corednsbuild

import (
	_ "github.com/coredns/coredns"
)
