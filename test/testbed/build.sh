#!/usr/bin/env bash
# Builds the runtime test bed's upstream components from Go modules, one
# directory per component and version, and skips whatever is already cached:
#
#   $COORDINO_TESTBED_CACHE/<component>-<version>/   (default /var/cache/coordino-testbed)
#
# usage: build.sh [component...]   components: containerd crictl etcd kubelet kube-apiserver
#                                   kube-controller-manager kube-scheduler kube-proxy kubectl
#                                   coredns agnhost e2e.test
#                                   (default: cri kube; "cri" = containerd crictl, "kube" = etcd kubelet kube-apiserver,
#                                    "cluster" = what the multi-node bed needs; e2e.test separately)
# env:   COORDINO_TESTBED_CACHE  cache root
#        TESTBED_NICE            nice level for the compiler (default 19: others keep working)
#        TESTBED_GOFLAGS         extra go flags, e.g. -p=1
#
# Every build writes "<component> <version> <seconds>s" to $CACHE/build-times.log
# so cold and warm build times can be compared later.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
CACHE=${COORDINO_TESTBED_CACHE:-/var/cache/coordino-testbed}
NICE=${TESTBED_NICE:-19}
EXTRA=${TESTBED_GOFLAGS:-}

K8S_VERSION=v1.37.2
ETCD_VERSION=v3.7.3
CONTAINERD_VERSION=v2.4.2
CRICTL_VERSION=v1.37.0
COREDNS_VERSION=v1.15.0

export CGO_ENABLED=0
mkdir -p "$CACHE"

# cached <component> <version>: true when a previous build finished (the
# marker is written last, so an interrupted build is redone).
cached() { [ -e "$CACHE/$1-$2/.complete" ]; }

# timed <component> <version> <cmd...>: builds into a temp dir, then renames it
# into place atomically so readers never see half a component.
timed() {
	local comp=$1 ver=$2; shift 2
	local dst="$CACHE/$comp-$ver" tmp="$CACHE/.tmp-$comp-$ver"
	rm -rf "$tmp"; mkdir -p "$tmp"
	local start; start=$(date +%s)
	echo ">> building $comp $ver"
	OUT="$tmp" "$@"
	local secs=$(( $(date +%s) - start ))
	touch "$tmp/.complete"
	rm -rf "$dst"; mv "$tmp" "$dst"
	echo "$(date -u +%FT%TZ) $comp $ver ${secs}s" | tee -a "$CACHE/build-times.log"
}

gobuild() { nice -n "$NICE" go build -trimpath $EXTRA "$@"; }
goinstall() { GOBIN="$OUT" nice -n "$NICE" go install -trimpath $EXTRA "$@"; }

build_containerd() {
	local C=github.com/containerd/containerd/v2 V=$CONTAINERD_VERSION
	local ldf="-s -w -X $C/version.Version=$V -X $C/version.Revision=coordino-testbed -X $C/version.Package=$C"
	# no_btrfs: btrfs snapshotter needs cgo headers; overlayfs is what the tests use.
	goinstall -tags no_btrfs -ldflags "$ldf" \
		"$C/cmd/containerd@$V" "$C/cmd/containerd-shim-runc-v2@$V" "$C/cmd/ctr@$V"
}

build_crictl() {
	goinstall -ldflags '-s -w' "sigs.k8s.io/cri-tools/cmd/crictl@$CRICTL_VERSION"
}

build_etcd() {
	(cd "$HERE/etcdbuild" && gobuild -ldflags '-s -w' -o "$OUT/etcd" go.etcd.io/etcd/server/v3)
}

# k8s_ldflags: stripped, with the cluster's version stamped in (components
# report it, e2e.test compares it).
k8s_ldflags() {
	local V=$K8S_VERSION minor
	minor=$(echo "$V" | cut -d. -f2)
	local ldf="-s -w"
	for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		ldf="$ldf -X $p.gitVersion=$V -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean -X $p.buildDate=2026-01-01T00:00:00Z"
	done
	echo "$ldf"
}

build_k8s() { # <cmd>
	(cd "$HERE/k8sbuild" && gobuild -ldflags "$(k8s_ldflags)" -o "$OUT/$1" "k8s.io/kubernetes/cmd/$1")
}

# e2e.test is the upstream conformance binary, compiled as the test binary of
# k8s.io/kubernetes/test/e2e with the cluster's version stamped in.
build_e2e() {
	(cd "$HERE/k8sbuild" && nice -n "$NICE" go test -c -vet=off -trimpath $EXTRA -ldflags "$(k8s_ldflags)" -o "$OUT/e2e.test" k8s.io/kubernetes/test/e2e)
}

# agnhost is the upstream suites' all-purpose test image program (servers,
# clients, netexec); the image around it is packed offline by the bed.
build_agnhost() {
	(cd "$HERE/k8sbuild" && gobuild -ldflags '-s -w' -o "$OUT/agnhost" k8s.io/kubernetes/test/images/agnhost)
}

build_coredns() {
	(cd "$HERE/corednsbuild" && gobuild -ldflags '-s -w' -o "$OUT/coredns" github.com/coredns/coredns)
}

want=("$@")
[ ${#want[@]} -eq 0 ] && want=(cri kube)
expanded=()
for w in "${want[@]}"; do
	case $w in
	cri) expanded+=(containerd crictl) ;;
	kube) expanded+=(etcd kubelet kube-apiserver) ;;
	cluster) expanded+=(containerd crictl etcd kube-apiserver kubelet kube-controller-manager kube-scheduler kube-proxy kubectl coredns agnhost) ;;
	*) expanded+=("$w") ;;
	esac
done

for comp in "${expanded[@]}"; do
	case $comp in
	containerd) cached containerd $CONTAINERD_VERSION || timed containerd $CONTAINERD_VERSION build_containerd ;;
	crictl) cached crictl $CRICTL_VERSION || timed crictl $CRICTL_VERSION build_crictl ;;
	etcd) cached etcd $ETCD_VERSION || timed etcd $ETCD_VERSION build_etcd ;;
	kubelet) cached kubelet $K8S_VERSION || timed kubelet $K8S_VERSION build_k8s kubelet ;;
	kube-apiserver) cached kube-apiserver $K8S_VERSION || timed kube-apiserver $K8S_VERSION build_k8s kube-apiserver ;;
	kube-controller-manager) cached kube-controller-manager $K8S_VERSION || timed kube-controller-manager $K8S_VERSION build_k8s kube-controller-manager ;;
	kube-scheduler) cached kube-scheduler $K8S_VERSION || timed kube-scheduler $K8S_VERSION build_k8s kube-scheduler ;;
	kube-proxy) cached kube-proxy $K8S_VERSION || timed kube-proxy $K8S_VERSION build_k8s kube-proxy ;;
	kubectl) cached kubectl $K8S_VERSION || timed kubectl $K8S_VERSION build_k8s kubectl ;;
	coredns) cached coredns $COREDNS_VERSION || timed coredns $COREDNS_VERSION build_coredns ;;
	agnhost) cached agnhost $K8S_VERSION || timed agnhost $K8S_VERSION build_agnhost ;;
	e2e.test) cached e2e.test $K8S_VERSION || timed e2e.test $K8S_VERSION build_e2e ;;
	*) echo "unknown component $comp" >&2; exit 2 ;;
	esac
done
echo "test bed components in $CACHE:"
for comp in "${expanded[@]}"; do ls -d "$CACHE/$comp-"* 2>/dev/null; done
