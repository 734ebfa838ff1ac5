#!/usr/bin/env bash
# Regenerates everything derived from api/coordino/v1alpha1: deep-copy
# functions and CRD manifests (controller-gen), and the typed clientset,
# listers and informers (k8s.io/code-generator). The generators are built
# from the Go module proxy at the pinned versions below, so every machine
# produces the same bytes.
set -euo pipefail
cd "$(dirname "$0")/.."

CONTROLLER_TOOLS_VERSION=v0.23.0
CODE_GENERATOR_VERSION=v0.37.2

MOD=github.com/coordino/coordino
BIN=$(mktemp -d)
trap 'rm -rf "$BIN"' EXIT
GOBIN=$BIN go install "sigs.k8s.io/controller-tools/cmd/controller-gen@$CONTROLLER_TOOLS_VERSION"
GOBIN=$BIN go install \
	"k8s.io/code-generator/cmd/client-gen@$CODE_GENERATOR_VERSION" \
	"k8s.io/code-generator/cmd/lister-gen@$CODE_GENERATOR_VERSION" \
	"k8s.io/code-generator/cmd/informer-gen@$CODE_GENERATOR_VERSION"

HEADER=hack/boilerplate.go.txt
rm -rf api/client api/crds
"$BIN/controller-gen" object:headerFile="$HEADER" crd:maxDescLen=400 \
	paths=./api/... output:crd:artifacts:config=api/crds
"$BIN/client-gen" --go-header-file "$HEADER" \
	--output-dir api/client/clientset --output-pkg "$MOD/api/client/clientset" \
	--clientset-name versioned --input-base "$MOD/api" --input coordino/v1alpha1
"$BIN/lister-gen" --go-header-file "$HEADER" \
	--output-dir api/client/listers --output-pkg "$MOD/api/client/listers" \
	./api/coordino/v1alpha1
"$BIN/informer-gen" --go-header-file "$HEADER" \
	--output-dir api/client/informers --output-pkg "$MOD/api/client/informers" \
	--versioned-clientset-package "$MOD/api/client/clientset/versioned" \
	--listers-package "$MOD/api/client/listers" \
	./api/coordino/v1alpha1
