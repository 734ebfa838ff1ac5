#!/usr/bin/env bash
# Installs FRR (Debian package frr) for the BGP fabric test (make test-fabric,
# test/multinode TestFabricBGP). The test runs FRR's zebra and bgpd itself,
# in the router's network namespace with a config dir of its own; the
# system service is kept from starting at install time.
set -euo pipefail
[ -x /usr/lib/frr/bgpd ] && command -v vtysh >/dev/null && exit 0
if [ "$(id -u)" -ne 0 ]; then echo "missing package frr; run as root to install it" >&2; exit 1; fi
export DEBIAN_FRONTEND=noninteractive
# policy-rc.d answering 101 keeps invoke-rc.d from starting frr.service.
policy=/usr/sbin/policy-rc.d
restore=""
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy"
  restore=1
fi
trap '[ -n "$restore" ] && rm -f "$policy"' EXIT
apt-get update -qq
apt-get install -y -qq --no-install-recommends frr >/dev/null
