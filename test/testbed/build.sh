#!/usr/bin/env bash
# Builds the runtime test bed's upstream components from Go modules, one
# directory per component and version, and skips whatever is already cached:
#
#   $COORDINO_TESTBED_CACHE/<component>-<version>/   (default /var/cache/coordino-testbed)
#
# usage: build.sh [component...]   components: containerd crictl etcd kubelet kube-apiserver
#                                   kube-controller-manager kube-scheduler kube-proxy kubectl
#                                   coredns agnhost userland e2e.test
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

# userland is the root filesystem the cluster bed's agnhost image gets around
# /agnhost, like upstream's image has around it: the programs the suites exec
# (sh and busybox's utilities, bash, curl, nc, dig, nslookup, host, getent), exactly
# the shared libraries they load, and porter's TLS certificate. The Debian
# packages are pinned in userland/packages.txt; the cache directory is named
# by that file's hash, so changing a pin rebuilds (its "recipe" comment is
# bumped when this function changes).
USERLAND_VERSION=$(sha256sum "$HERE/userland/packages.txt" | cut -c1-12)
build_userland() {
	local debs="$OUT/debs" raw="$OUT/unpacked" root="$OUT/rootfs"
	mkdir -p "$debs" "$raw" "$root"
	# shellcheck disable=SC2046 # one argument per pinned package
	(cd "$debs" && apt-get download -q $(grep -v '^\s*#' "$HERE/userland/packages.txt")) || {
		echo "userland: apt-get download failed: run apt-get update, or re-pin a version the archive dropped" >&2
		return 1
	}
	for d in "$debs"/*.deb; do dpkg-deb -x "$d" "$raw"; done

	local libdirs="$raw/lib/x86_64-linux-gnu:$raw/usr/lib/x86_64-linux-gnu"
	local loader="$raw/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"
	install -D -m 0755 "$raw/bin/busybox" "$root/bin/busybox"
	# The real tools take their upstream names; busybox fills in the rest.
	local -A tools=([bin/bash]=bin/bash [usr/bin/curl]=usr/bin/curl [bin/nc.openbsd]=usr/bin/nc
		[usr/bin/dig]=usr/bin/dig [usr/bin/nslookup]=usr/bin/nslookup [usr/bin/host]=usr/bin/host
		[usr/bin/getent]=usr/bin/getent)
	local src lib
	for src in "${!tools[@]}"; do
		install -D -m 0755 "$raw/$src" "$root/${tools[$src]}"
		# The unpacked loader resolves the libraries; any found outside
		# the unpacked packages means packages.txt lacks one.
		"$loader" --library-path "$libdirs" --list "$raw/$src" | awk '/=>/ {print $3}' | while read -r lib; do
			case $lib in
			"$raw"/*) install -D -m 0755 "$(readlink -f "$lib")" "$root/${lib#"$raw"/}" ;;
			*) echo "userland: $src needs $lib, not in userland/packages.txt" >&2; exit 1 ;;
			esac
		done
	done
	install -D -m 0755 "$loader" "$root/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"
	mkdir -p "$root/lib64"
	ln -sf ../lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 "$root/lib64/ld-linux-x86-64.so.2"
	# Debian's static busybox runs its own applets before searching PATH,
	# so its sh would run busybox nc, not netcat-openbsd: sh is bash.
	ln -s bash "$root/bin/sh"
	local applet
	"$raw/bin/busybox" --list-full | while read -r applet; do
		[ -e "$root/$applet" ] || { mkdir -p "$root/$(dirname "$applet")"; ln -s /bin/busybox "$root/$applet"; }
	done

	mkdir -p "$root/etc" "$root/uploads"
	printf 'root:x:0:0:root:/root:/bin/sh\nuser-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$root/etc/passwd"
	printf 'root:x:0:\nuser-defined-in-image:x:1000:\ngroup-defined-in-image:x:50000:user-defined-in-image\nnogroup:x:65534:\n' >"$root/etc/group"
	printf 'hosts: files dns\npasswd: files\ngroup: files\n' >"$root/etc/nsswitch.conf"
	local porter
	porter=$(cd "$HERE/k8sbuild" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)/test/images/agnhost/porter
	install -m 0644 "$porter/localhost.crt" "$porter/localhost.key" "$root/"
	ln -s agnhost "$root/agnhost-2"
	rm -rf "$raw"
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
	cluster) expanded+=(containerd crictl etcd kube-apiserver kubelet kube-controller-manager kube-scheduler kube-proxy kubectl coredns agnhost userland) ;;
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
	userland) cached userland "$USERLAND_VERSION" || timed userland "$USERLAND_VERSION" build_userland ;;
	e2e.test) cached e2e.test $K8S_VERSION || timed e2e.test $K8S_VERSION build_e2e ;;
	*) echo "unknown component $comp" >&2; exit 2 ;;
	esac
done
echo "test bed components in $CACHE:"
for comp in "${expanded[@]}"; do ls -d "$CACHE/$comp-"* 2>/dev/null; done
