#!/usr/bin/env bash
# Builds the plugin and daemon of a previous release (a commit) into
# bin/previous/<commit>/, for the plugin/daemon skew tests (test/skew).
# The build is cached: a directory that already holds both binaries is kept.
# Usage: hack/build-previous.sh <commit>; the last line of its output is
# the directory's absolute path. Exit 3: the commit is not in this checkout.
set -euo pipefail
cd "$(dirname "$0")/.."
ref="${1:?usage: hack/build-previous.sh <commit>}"
if ! commit="$(git rev-parse --verify --quiet "${ref}^{commit}")"; then
  # Exit 3: the skew tests say they did not run (a shallow clone has no
  # older commit to build), rather than fail a checkout they cannot judge.
  echo "previous release ${ref} is not in this checkout's history (a shallow clone? git fetch --unshallow): the skew tests cannot run" >&2
  exit 3
fi
out="bin/previous/${commit}"
if [ -x "${out}/coordino" ] && [ -x "${out}/coordino-daemon" ]; then
  echo "previous release ${commit}: cached" >&2
  echo "${PWD}/${out}"
  exit 0
fi
src="$(mktemp -d)"
trap 'git worktree remove --force "${src}" >/dev/null 2>&1 || rm -rf "${src}"; git worktree prune' EXIT
git worktree add --detach "${src}" "${commit}" >/dev/null
mkdir -p "${out}.tmp"
( cd "${src}" &&
  CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "${OLDPWD}/${out}.tmp/coordino" ./plugin/cmd/coordino &&
  CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "${OLDPWD}/${out}.tmp/coordino-daemon" ./daemon/cmd/coordino-daemon )
echo "${commit}" >"${out}.tmp/COMMIT"
rm -rf "${out}" && mv "${out}.tmp" "${out}"
echo "previous release ${commit}: built" >&2
echo "${PWD}/${out}"
