#!/usr/bin/env bash
# Installs the Debian packages the runtime test bed needs, only when missing:
# runc (containerd's OCI runtime), iptables (kubelet's canary chains), openssl
# (throwaway cluster certs), iproute2/util-linux (ip, nsenter, mount helpers),
# and the reference CNI plugins as a fallback when bin/ref is not built.
set -euo pipefail
need=()
command -v runc >/dev/null || [ -x /usr/sbin/runc ] || need+=(runc)
command -v iptables >/dev/null || need+=(iptables)
command -v openssl >/dev/null || need+=(openssl)
command -v ip >/dev/null || need+=(iproute2)
command -v nsenter >/dev/null || need+=(util-linux)
command -v mount >/dev/null || need+=(mount)
[ -e /usr/lib/cni/bridge ] || need+=(containernetworking-plugins)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
	echo "missing Debian packages: ${need[*]} (run as root to install)" >&2
	exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
# Debian's containernetworking-plugins has been seen installed with an empty /usr/lib/cni.
[ -e /usr/lib/cni/bridge ] || apt-get install -y -qq --reinstall containernetworking-plugins >/dev/null
