#!/usr/bin/env bash
# Installs the Debian packages the build, tests and demo need, once.
set -euo pipefail
need=()
command -v ip >/dev/null || need+=(iproute2)
command -v nsenter >/dev/null || need+=(util-linux)
command -v protoc >/dev/null || need+=(protobuf-compiler)
command -v clang >/dev/null || need+=(clang llvm)
[ -e /usr/include/bpf/bpf_helpers.h ] || need+=(libbpf-dev)
[ -e /usr/lib/cni/bridge ] || need+=(containernetworking-plugins)
command -v iperf3 >/dev/null || need+=(iperf3)
command -v ethtool >/dev/null || need+=(ethtool)  # the VXLAN path bench turns veth GRO on
command -v nft >/dev/null || need+=(nftables)
command -v iptables >/dev/null || need+=(iptables)
command -v promtool >/dev/null || need+=(prometheus)  # promtool: metric-name lint in tests
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then echo "missing packages ${need[*]}; run as root to install them" >&2; exit 1; fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
# Debian's containernetworking-plugins sometimes ships an empty /usr/lib/cni.
if [ "$(id -u)" -eq 0 ] && [ ! -e /usr/lib/cni/bridge ]; then
  apt-get install -y -qq --reinstall containernetworking-plugins >/dev/null
fi
