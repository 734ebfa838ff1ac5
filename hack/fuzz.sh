#!/usr/bin/env bash
# Runs every fuzz target in the module for FUZZTIME (default 20s) each.
set -euo pipefail
cd "$(dirname "$0")/.."
fuzztime="${FUZZTIME:-20s}"
for pkg in $(go list ./...); do
  for target in $(go test -list '^Fuzz' "$pkg" 2>/dev/null | grep '^Fuzz' || true); do
    echo "== $pkg $target ($fuzztime)"
    go test -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" "$pkg"
  done
done
