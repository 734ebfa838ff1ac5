# Coordino build, test, demo and benchmark entry points. Every target installs
# what it needs itself (Debian packages via hack/deps.sh, Go modules via go).
SHELL := /bin/bash
GO ?= go
BIN := bin
BINARIES := coordino coordino-daemon coordino-install coordino-controller coordinoctl coordino-wireguard
REF_PLUGINS := bridge host-local ptp portmap macvlan

.PHONY: all build ref-plugins deps generate generate-proto generate-bpf generate-api check-generated test e2e-runtime testbed-up testbed-down test-unit test-e2e test-fabric test-kernels demo bench bench-controller fuzz lint clean

all: build

deps:
	@hack/deps.sh

build:
	@mkdir -p $(BIN)
	# Stripped (-s -w): smaller image, same stack traces. The plugin links no grpc-go or protobuf runtime (plugin/unarygrpc, proto/cni/v1/wire): see docs/benchmarks.md.
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags='-s -w' -o $(BIN)/coordino ./plugin/cmd/coordino
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags='-s -w' -o $(BIN)/coordino-daemon ./daemon/cmd/coordino-daemon
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags='-s -w' -o $(BIN)/coordino-wireguard ./daemon/cmd/coordino-wireguard
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags='-s -w' -o $(BIN)/coordinoctl ./daemon/cmd/coordinoctl
	@if [ -f install/cmd/coordino-install/main.go ]; then CGO_ENABLED=0 $(GO) build -trimpath -ldflags='-s -w' -o $(BIN)/coordino-install ./install/cmd/coordino-install; fi
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags='-s -w' -o $(BIN)/coordino-controller ./controller/cmd/coordino-controller

# The previous release, for the plugin/daemon skew tests (test/skew): a
# commit until the repository has tags; move it forward with each release.
# Its plugin and daemon are built once into bin/previous/<commit>/.
PREVIOUS_RELEASE ?= 94d90b4
export PREVIOUS_RELEASE

.PHONY: previous-release
previous-release:
	hack/build-previous.sh $(PREVIOUS_RELEASE) || [ $$? -eq 3 ]

# Reference plugins from github.com/containernetworking/plugins at the version in go.mod.
ref-plugins:
	@mkdir -p $(BIN)/ref
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN)/ref/ github.com/containernetworking/plugins/plugins/main/bridge github.com/containernetworking/plugins/plugins/main/ptp github.com/containernetworking/plugins/plugins/main/macvlan github.com/containernetworking/plugins/plugins/ipam/host-local github.com/containernetworking/plugins/plugins/meta/portmap

generate: generate-proto generate-bpf generate-api

generate-proto: deps
	PATH="$$(dirname $$($(GO) tool -n protoc-gen-go)):$$(dirname $$($(GO) tool -n protoc-gen-go-grpc)):$$PATH" \
	  protoc --go_out=. --go_opt=paths=source_relative \
	         --go-grpc_out=. --go-grpc_opt=paths=source_relative proto/cni/v1/cni.proto proto/flow/v1/flow.proto proto/inspect/v1/inspect.proto

generate-bpf: deps
	@if [ -d bpf ] && ls bpf/*.go >/dev/null 2>&1; then $(GO) generate ./bpf/...; fi

# CRD deep-copy, manifests and typed client (pinned controller-gen and code-generator).
generate-api:
	hack/generate-api.sh

# Regenerates protobuf, BPF and API code and fails if the committed copies differ.
check-generated: generate
	@git diff --exit-code --stat -- proto bpf api && [ -z "$$(git ls-files --others --exclude-standard -- api)" ] || { echo "generated code is stale: run make generate and commit"; exit 1; }

# gofmt, go vet, and golangci-lint with the checks of .golangci.yml
# (errcheck, staticcheck, ineffassign, misspell, unused) at the version
# pinned in hack/tools/go.mod.
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed: $$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags 'clustere2e benchmultinode fabric' ./test/cluster/ ./test/multinode/
	$(GO) tool -modfile=hack/tools/go.mod golangci-lint run ./...

# The one test command: unit, fuzz-seed and privileged node e2e tests, then
# the containerd CRI part of the runtime e2e (its binaries are built once and
# cached). Under CI=true privileged tests fail instead of skipping. The
# kubelet part needs kube-apiserver and kubelet builds (~25 min cold on 2
# cores): `make e2e-runtime`.
test: deps build ref-plugins lint check-generated previous-release
	test/testbed/build.sh etcd kube-apiserver kube-proxy  # test/apiserver: real API server tests; test/k8smode: kube-proxy
	hack/fabric-deps.sh  # test/multinode TestFabricBGP: FRR as the racks' router
	$(GO) test -count=1 -timeout 20m $$($(GO) list ./... | grep -v /test/runtime)
	test/testbed/deps.sh
	test/testbed/build.sh cri
	COORDINO_RUNTIME_E2E=cri $(GO) test -count=1 -timeout 15m -run '^TestCRI' ./test/runtime/
	@# The host ran every package above: the matrix adds the guest kernels.
	$(MAKE) --no-print-directory test-kernels KERNELS="$(GUEST_KERNELS)" HOST_NOTE="go test ./... above ran every package on this host's kernel"

# The kernel matrix (docs/kernels.md): the suites of test/kernels on this
# host's kernel and, in qemu guests, on Debian's newest 6.1 and 6.12 (kept in
# /var/cache/coordino-kernels). Narrow it with KERNELS="6.1", SUITES=datapath
# (a regexp of suite names) and RUN='^TestVerdicts$$' (replaces the suites'
# -test.run); V=1 shows the guests' consoles, NO_CONNTRACK=1 leaves
# nf_conntrack to be loaded on demand instead of before the suites.
GUEST_KERNELS := 6.1 6.12
KERNELS ?= host $(GUEST_KERNELS)
test-kernels: deps build ref-plugins
	hack/kernels-deps.sh
	$(GO) build -o $(BIN)/kernels/kernels ./test/kernels/cmd/kernels
	$(BIN)/kernels/kernels -kernels "$(KERNELS)" -suites "$(SUITES)" -run "$(RUN)" -host-note "$(HOST_NOTE)" $(if $(V),-v) $(if $(NO_CONNTRACK),-no-conntrack)

# The BGP fabric (docs/cluster.md): two racks behind an FRR router, nodes
# with --routing=bgp. TestFabricBGP (about 30 s) is also part of make test;
# the fabric tag adds the Kubernetes-mode fabric (Service addresses, a Node
# deleted; about 35 s) and BGP with WireGuard (about 20 s).
test-fabric: deps build ref-plugins
	hack/fabric-deps.sh
	$(GO) test -tags fabric -count=1 -v -run '^TestFabricBGP' ./test/multinode/

# Everything of the runtime e2e: crictl, kubelet, restarts, latency.
e2e-runtime: deps build ref-plugins
	test/testbed/deps.sh
	test/testbed/build.sh
	COORDINO_RUNTIME_E2E=1 $(GO) test -count=1 -v -timeout 30m ./test/runtime/

# A real kube-apiserver + kubelet + containerd with Coordino, for kubectl by hand.
testbed-up: deps build ref-plugins
	test/testbed/deps.sh
	test/testbed/build.sh
	$(GO) run ./test/testbed/cmd/testbed up

testbed-down:
	test/testbed/teardown.sh

demo: deps build ref-plugins
	$(GO) run ./test/demo

bench: deps build ref-plugins
	$(GO) run ./test/bench $(ARGS)

# Sustained churn on one node: 500 pods/min for CHURN_DURATION (10 min), then
# a leak check; prints each goal with met/MISSED (make bench-churn CHURN_DURATION=2m).
CHURN_DURATION ?= 10m
.PHONY: bench-churn
bench-churn: deps build
	$(GO) run ./test/churn -duration $(CHURN_DURATION) $(ARGS)

fuzz:
	hack/fuzz.sh

# Controller at cluster scale, in process (5,000 nodes, 550,000 pods, 2,000
# namespaces by default; COORDINO_BENCH_NODES, _PODS_PER_NODE, _NAMESPACES).
bench-controller:
	$(GO) test -run '^$$' -bench '^BenchmarkClusterScale$$' -benchtime 1x -timeout 30m ./controller/
	# Its own process, so the peak RSS it reports is its own.
	$(GO) test -run '^$$' -bench '^BenchmarkPolicyCompile$$' -benchtime 1x -timeout 30m ./controller/

clean:
	rm -rf $(BIN)

# Policy scale: ADD latency with 0, 1k and 10k NetworkPolicies loaded and the
# time from a policy file change to enforcement (ARGS=-quick for a short run).
.PHONY: bench-policy
bench-policy: deps build ref-plugins
	$(GO) run ./test/policybench -scale $(ARGS)
# Cross-node pod-to-pod throughput (1 and 4 streams) and request/response
# rate per routing mode, each against a reference in the same run.
.PHONY: bench-multinode
bench-multinode: deps build ref-plugins
	$(GO) test -tags benchmultinode -count=1 -v -timeout 30m -run '^TestBenchMultinode$$' ./test/multinode/
# Pod → a host outside the cluster through the masquerade against the same
# path with the pod CIDR routed: TCP throughput and new connections (1 min);
# then the concurrent flows a node holds to one destination against the
# NAT's port range (25 s).
.PHONY: bench-masquerade
bench-masquerade: deps build ref-plugins
	$(GO) test -tags benchmultinode -count=1 -v -timeout 10m -run '^TestBenchMasquerade(Ports)?$$' ./test/multinode/

# The Coordino image (every binary of build and the reference portmap
# plugin from ref-plugins, on an empty base) as a
# docker-archive, built offline: `ctr -n k8s.io images import`, `docker load`
# or `kind load image-archive` it. The manifests reference $(IMAGE)
# (install/kubernetes/base, images:). See docs/install.md.
IMAGE ?= coordino/coordino:dev
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
IMAGE_ARCHIVE ?= $(BIN)/coordino-image.tar
.PHONY: image
image: build ref-plugins
	$(GO) run ./install/cmd/coordino-image -bin $(BIN) -tag $(IMAGE) -version $(VERSION) -o $(IMAGE_ARCHIVE)

# Controller and daemon against the real kube-apiserver (root; cached
# kube-apiserver + etcd): Node creation to a block and to a daemon serving
# ADDs, controller CPU, heap and writes per pod (500 Nodes, 20,000 Pods by
# default; ARGS="-k8s-scale-nodes 100 -k8s-scale-pods 2000" for less).
.PHONY: bench-k8s
bench-k8s: deps build ref-plugins
	$(GO) test -count=1 -run '^$$' -bench '^BenchmarkClusterOnAPIServer$$' -benchtime 1x -timeout 30m ./test/k8smode/ -args $(ARGS)

# A ClusterNetworkPolicy change from the API write to the verdict on every
# node's wire: real kube-apiserver, 3 Kubernetes-mode netns nodes, 1,000
# other ClusterNetworkPolicies loaded, 40 changes; p50 and p99 (goal p99 < 1 s).
# ARGS="-cnp-change-nodes 5 -cnp-change-background 200 -cnp-changes 20" to vary.
.PHONY: bench-cnp-change
bench-cnp-change: deps build ref-plugins
	$(GO) test -count=1 -v -run '^$$' -bench '^BenchmarkClusterPolicyChange$$' -benchtime 1x -timeout 20m ./test/k8smode/ -args $(ARGS)

# Multi-node Kubernetes cluster on this machine (test/cluster): a control
# plane and WORKERS nodes, each a network namespace on an underlay bridge,
# Coordino installed with kubectl apply -k from the offline-built image.
# cluster-up returns with the cluster running (it prints KUBECONFIG);
# cluster-down removes everything. e2e-cluster runs the upstream e2e.test
# suites (E2E_SUITE=netpol|conformance|all, see test/cluster/e2e.sh) and
# leaves the cluster up for inspection. First builds are long (measured in
# docs/cluster.md, "Components and build times"): test/testbed/build.sh caches
# them by version. DATAPATH=ebpf|nftables|auto starts the daemons with
# --datapath (empty: the manifest's default, unchecked); cluster-up checks
# every daemon reports it, and e2e-cluster checks the bed's before and after
# the suites. ROUTING=bgp stands the workers in two racks on different
# subnets behind an FRR router (hack/fabric-deps.sh), daemons with
# --routing=bgp and a BGPPeerPolicy per rack (docs/cluster.md).
WORKERS ?= 2
DATAPATH ?=
ROUTING ?=
.PHONY: cluster-up cluster-down e2e-cluster e2e-cluster-smoke e2e-upgrade
cluster-up: image
	test/testbed/deps.sh
	if [ '$(ROUTING)' = bgp ]; then hack/fabric-deps.sh; fi
	TESTBED_NICE=$${TESTBED_NICE:-10} test/testbed/build.sh cluster
	$(GO) build -o $(BIN)/coordino-cluster ./test/cluster/cmd/cluster
	$(BIN)/coordino-cluster -workers $(WORKERS) -datapath '$(DATAPATH)' -routing '$(ROUTING)' up

cluster-down:
	$(GO) build -o $(BIN)/coordino-cluster ./test/cluster/cmd/cluster
	$(BIN)/coordino-cluster down

# A bed already up (make cluster-up) is used as it is: its Coordino is the
# image it came up with (make cluster-down first for a fresh one).
e2e-cluster:
	$(GO) build -o $(BIN)/coordino-cluster ./test/cluster/cmd/cluster
	@if $(BIN)/coordino-cluster status; then echo "e2e-cluster: using that bed as it is (make cluster-down first for one with this tree's image)"; else $(MAKE) cluster-up; fi
	TESTBED_NICE=$${TESTBED_NICE:-10} test/testbed/build.sh e2e.test
ifneq ($(DATAPATH),)
	$(BIN)/coordino-cluster -datapath '$(DATAPATH)' datapath
	test/cluster/e2e.sh; rc=$$?; $(BIN)/coordino-cluster -datapath '$(DATAPATH)' datapath && exit $$rc
else
	test/cluster/e2e.sh
endif

# The ClusterNetworkPolicy conformance suite (sigs.k8s.io/network-policy-api
# at the version in go.mod, standard profile by default) against the bed, as
# e2e-cluster does: see test/cluster/cnp-conformance.sh and docs/conformance.md.
.PHONY: e2e-cluster-cnp
e2e-cluster-cnp:
	$(GO) build -o $(BIN)/coordino-cluster ./test/cluster/cmd/cluster
	@if $(BIN)/coordino-cluster status; then echo "e2e-cluster-cnp: using that bed as it is (make cluster-down first for one with this tree's image)"; else $(MAKE) cluster-up; fi
	test/cluster/cnp-conformance.sh

# Rolling upgrade and roll back under traffic (test/cluster
# TestClusterUpgrade, about 10 min): the bed installed from PREVIOUS_RELEASE
# (its own make image, tagged coordino/coordino:previous, and its
# manifests), cross-node TCP connections and UDP streams plus probes the
# policy denies, the controller and each node's daemon rolled to this
# tree's image and back. Fails, naming why, when PREVIOUS_RELEASE is not in
# this checkout or lacks an image target or the primary overlay.
# ENCRYPTION=wireguard: the same with every daemon of both releases on
# --encryption=wireguard (the userspace device), and each node's underlay
# watched throughout: no pod-to-pod packet in the clear, WireGuard frames
# on both nodes between every two steps.
ENCRYPTION ?=
e2e-upgrade: image
	test/testbed/deps.sh
	TESTBED_NICE=$${TESTBED_NICE:-10} test/testbed/build.sh cluster
	prev="$$(hack/build-previous.sh --image $(PREVIOUS_RELEASE))" && \
	COORDINO_UPGRADE_PREVIOUS="$$prev" COORDINO_UPGRADE_ENCRYPTION='$(ENCRYPTION)' $(GO) test -tags clustere2e -count=1 -v -timeout 30m -run '^TestClusterUpgrade$$' ./test/cluster/

# Two workers, Coordino via kustomize, pod-to-pod on one node and across
# nodes, one NetworkPolicy case, tear-down leaves the host unchanged.
e2e-cluster-smoke: image
	test/testbed/deps.sh
	TESTBED_NICE=$${TESTBED_NICE:-10} test/testbed/build.sh cluster
	$(GO) test -tags clustere2e -count=1 -v -timeout 30m -run '^TestClusterSmoke$$' ./test/cluster/

# The bed's non-default Service range from the API, a ServiceCIDR added
# live, NodePort with egress policy, and the outside host (masquerade), on
# two workers (docs/cluster.md).
e2e-cluster-egress: image
	test/testbed/deps.sh
	TESTBED_NICE=$${TESTBED_NICE:-10} test/testbed/build.sh cluster
	$(GO) test -tags clustere2e -count=1 -v -timeout 30m -run '^TestClusterEgress$$' ./test/cluster/

# The chained overlay over a bridge + host-local primary (pods networked,
# policy enforced), then the documented uninstall kit, which must leave every
# node as it was before the install.
.PHONY: e2e-cluster-chained
e2e-cluster-chained: image ref-plugins
	test/testbed/deps.sh
	TESTBED_NICE=$${TESTBED_NICE:-10} test/testbed/build.sh cluster
	$(GO) test -tags clustere2e -count=1 -v -timeout 30m -run '^TestClusterChainedUninstall$$' ./test/cluster/

# Pod startup at density on the bed (three workers), Coordino and then the
# reference bridge + host-local: 110 pods/node created at 10 pods/s, churn at
# 500 pods/node/min for 3 min (BENCH_CLUSTER_PODS, _CREATE_RATE, _CHURN_RATE,
# _CHURN_DURATION; ARGS=-short for a quick run). Uses the bed: see docs/cluster.md.
.PHONY: bench-cluster
bench-cluster: image ref-plugins
	test/testbed/deps.sh
	TESTBED_NICE=$${TESTBED_NICE:-10} test/testbed/build.sh cluster
	$(GO) build -o $(BIN)/bench-cluster ./test/cluster/cmd/bench-cluster
	$(BIN)/bench-cluster $(ARGS)
