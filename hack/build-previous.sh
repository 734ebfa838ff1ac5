#!/usr/bin/env bash
# Builds the plugin, daemon and controller of a previous release (a commit)
# into bin/previous/<commit>/, for the skew tests (test/skew, the plugin and
# daemon; test/k8smode, the controller).
# With --image it builds instead that release's image (its own make image,
# tagged coordino/coordino:previous) into bin/previous/<commit>-image/, with
# its install manifests (install/kubernetes and api/crds) beside it, for
# make e2e-upgrade.
# The build is cached: a directory that already holds the outputs is kept.
# Usage: hack/build-previous.sh [--image] <commit>; the last line of its
# output is the directory's absolute path. Exit 3: the commit is not in this
# checkout. Exit 4 (--image): the commit lacks what an image build needs.
set -euo pipefail
cd "$(dirname "$0")/.."
image=""
if [ "${1:-}" = "--image" ]; then
  image=1
  shift
fi
ref="${1:?usage: hack/build-previous.sh [--image] <commit>}"
if ! commit="$(git rev-parse --verify --quiet "${ref}^{commit}")"; then
  # Exit 3: the skew tests say they did not run (a shallow clone has no
  # older commit to build), rather than fail a checkout they cannot judge.
  echo "previous release ${ref} is not in this checkout's history (a shallow clone? git fetch --unshallow): the skew and upgrade tests cannot run" >&2
  exit 3
fi
out="bin/previous/${commit}"
if [ -n "${image}" ]; then
  out="${out}-image"
  if [ -f "${out}/coordino-image.tar" ] && [ -f "${out}/manifests/install/kubernetes/overlays/primary/kustomization.yaml" ]; then
    echo "previous release ${commit} image: cached" >&2
    echo "${PWD}/${out}"
    exit 0
  fi
  # What the upgrade test installs and rolls from: the image target and
  # the primary overlay. A commit from before them cannot be the previous
  # release of e2e-upgrade.
  for need in install/cmd/coordino-image/main.go install/kubernetes/overlays/primary/kustomization.yaml api/crds/kustomization.yaml; do
    if ! git cat-file -e "${commit}:${need}" 2>/dev/null; then
      echo "previous release ${commit} has no ${need}: it cannot be installed as the upgrade test's previous release (set PREVIOUS_RELEASE to a later commit)" >&2
      exit 4
    fi
  done
fi
if [ -z "${image}" ] && [ -x "${out}/coordino" ] && [ -x "${out}/coordino-daemon" ] && [ -x "${out}/coordino-controller" ]; then
  echo "previous release ${commit}: cached" >&2
  echo "${PWD}/${out}"
  exit 0
fi
src="$(mktemp -d)"
trap 'git worktree remove --force "${src}" >/dev/null 2>&1 || rm -rf "${src}"; git worktree prune' EXIT
git worktree add --detach "${src}" "${commit}" >/dev/null
rm -rf "${out}.tmp"
mkdir -p "${out}.tmp"
if [ -n "${image}" ]; then
  # Its own make image, so the image holds what that release shipped;
  # another tag, so a node holds both images at once.
  make -C "${src}" image IMAGE=coordino/coordino:previous VERSION="${commit:0:7}" IMAGE_ARCHIVE="${PWD}/${out}.tmp/coordino-image.tar" >&2
  mkdir -p "${out}.tmp/manifests"
  # The YAML only: Go files under bin/ would join this module's packages.
  git archive "${commit}" install/kubernetes api/crds | tar -x -C "${out}.tmp/manifests" --wildcards '*.yaml'
else
  ( cd "${src}" &&
    CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "${OLDPWD}/${out}.tmp/coordino" ./plugin/cmd/coordino &&
    CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "${OLDPWD}/${out}.tmp/coordino-daemon" ./daemon/cmd/coordino-daemon &&
    CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "${OLDPWD}/${out}.tmp/coordino-controller" ./controller/cmd/coordino-controller )
fi
echo "${commit}" >"${out}.tmp/COMMIT"
rm -rf "${out}" && mv "${out}.tmp" "${out}"
echo "previous release ${commit}${image:+ image}: built" >&2
echo "${PWD}/${out}"
