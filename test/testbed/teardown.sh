#!/usr/bin/env bash
# Removes whatever a runtime test bed left behind (processes by recorded PID,
# containerd shims of the bed, mounts, cgroups, kubelet's iptables chains,
# sysctls, the bed directory). Idempotent; the tests run the same code first.
set -euo pipefail
cd "$(dirname "$0")/../.."
exec go run ./test/testbed/cmd/testbed down
