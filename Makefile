# Coordino build, test, demo and benchmark entry points. Every target installs
# what it needs itself (Debian packages via hack/deps.sh, Go modules via go).
SHELL := /bin/bash
GO ?= go
BIN := bin
BINARIES := coordino coordino-daemon coordino-install
REF_PLUGINS := bridge host-local ptp portmap macvlan

.PHONY: all build ref-plugins deps generate generate-proto generate-bpf check-generated test test-unit test-e2e demo bench fuzz lint clean

all: build

deps:
	@hack/deps.sh

build:
	@mkdir -p $(BIN)
	# grpcnotrace drops x/net/trace (and html/template): ~1.4 ms less per plugin exec.
	CGO_ENABLED=0 $(GO) build -tags grpcnotrace -trimpath -ldflags='-s -w' -o $(BIN)/coordino ./plugin/cmd/coordino
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN)/coordino-daemon ./daemon/cmd/coordino-daemon
	@if [ -f install/cmd/coordino-install/main.go ]; then CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN)/coordino-install ./install/cmd/coordino-install; fi

# Reference plugins from github.com/containernetworking/plugins at the version in go.mod.
ref-plugins:
	@mkdir -p $(BIN)/ref
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN)/ref/ github.com/containernetworking/plugins/plugins/main/bridge github.com/containernetworking/plugins/plugins/main/ptp github.com/containernetworking/plugins/plugins/main/macvlan github.com/containernetworking/plugins/plugins/ipam/host-local github.com/containernetworking/plugins/plugins/meta/portmap

generate: generate-proto generate-bpf

generate-proto: deps
	PATH="$$(dirname $$($(GO) tool -n protoc-gen-go)):$$(dirname $$($(GO) tool -n protoc-gen-go-grpc)):$$PATH" \
	  protoc --go_out=. --go_opt=paths=source_relative \
	         --go-grpc_out=. --go-grpc_opt=paths=source_relative proto/cni/v1/cni.proto proto/flow/v1/flow.proto

generate-bpf: deps
	@if [ -d bpf ] && ls bpf/*.go >/dev/null 2>&1; then $(GO) generate ./bpf/...; fi

# Regenerates protobuf and BPF code and fails if the committed copies differ.
check-generated: generate
	@git diff --exit-code --stat -- proto bpf || { echo "generated code is stale: run make generate and commit"; exit 1; }

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed: $$out"; exit 1; fi
	$(GO) vet ./...

# The one test command: unit tests, then privileged e2e tests (root). Under
# CI=true privileged tests fail instead of skipping.
test: deps build ref-plugins lint check-generated
	$(GO) test -count=1 -timeout 20m ./...

demo: deps build ref-plugins
	$(GO) run ./test/demo

bench: deps build ref-plugins
	$(GO) run ./test/bench

fuzz:
	hack/fuzz.sh

clean:
	rm -rf $(BIN)
