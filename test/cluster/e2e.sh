#!/usr/bin/env bash
# Runs the upstream e2e.test (k8s.io/kubernetes/test/e2e at the cluster's
# version, built by test/testbed/build.sh e2e.test) against the cluster
# `make cluster-up` started. Results: a log and JUnit XML per suite under
# $E2E_REPORT_DIR (default /tmp/coordino-e2e).
#
#   E2E_SUITE=netpol       [sig-network] Netpol (NetworkPolicy, TCP and UDP)
#   E2E_SUITE=conformance  sig-network [Conformance] that need nothing outside the machine
#   E2E_SUITE=all          both (default)
#   E2E_FOCUS / E2E_SKIP   replace the suite's regexps (one-off runs)
#   E2E_CNP_PASSALL=1      apply cnp-passall.yaml (an Admin and a Baseline
#                          ClusterNetworkPolicy passing everything to NetworkPolicy)
#                          before the suites, check both Accepted, remove them after
#
# Every skip is listed in e2e-skips.txt with its reason.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
CACHE=${COORDINO_TESTBED_CACHE:-/var/cache/coordino-testbed}
DIR=${COORDINO_CLUSTER_DIR:-/run/coordino-cluster}
K8S_VERSION=$(sed -n 's/^\tK8sVersion *= "\(.*\)"/\1/p' "$HERE/../testbed/bed.go")
E2E="$CACHE/e2e.test-$K8S_VERSION/e2e.test"
KUBECTL="$CACHE/kubectl-$K8S_VERSION/kubectl"
KUBECONFIG="$DIR/pki/admin.kubeconfig"
REPORT=${E2E_REPORT_DIR:-/tmp/coordino-e2e}
SUITE=${E2E_SUITE:-all}

for f in "$E2E" "$KUBECTL" "$KUBECONFIG"; do
	[ -e "$f" ] || { echo "$f missing: make cluster-up, test/testbed/build.sh e2e.test" >&2; exit 2; }
done

# The skip list: one regexp per line, '#' comments explain each.
skips=$(grep -v '^\s*#' "$HERE/e2e-skips.txt" | grep -v '^\s*$' | paste -sd'|')

run() { # <name> <focus> <skip>
	local name=$1 focus=$2 skip=$3
	mkdir -p "$REPORT/$name"
	echo ">> $name: focus=$focus skip=$skip"
	local start; start=$(date +%s)
	set +e
	"$E2E" --kubeconfig="$KUBECONFIG" --provider=local --kubectl-path="$KUBECTL" \
		--report-dir="$REPORT/$name" --ginkgo.no-color --ginkgo.v \
		--ginkgo.focus="$focus" --ginkgo.skip="$skip" \
		--ginkgo.timeout=4h --allowed-not-ready-nodes=0 \
		2>&1 | tee "$REPORT/$name/e2e.log" | grep -a -E '^(•|\[FAIL\]|\[SKIPPED\]|Ran |PASS|FAIL|SUCCESS)'
	[ "${PIPESTATUS[0]}" -eq 0 ] || failed=1
	set -e
	echo ">> $name took $(( $(date +%s) - start ))s; log $REPORT/$name/e2e.log"
	grep -a -E '^Ran [0-9]+ of [0-9]+ Specs|^(SUCCESS|FAIL)! ' "$REPORT/$name/e2e.log" || true
}

passall() { # apply|delete
	local f=$HERE/cnp-passall.yaml
	if [ "$1" = delete ]; then "$KUBECTL" --kubeconfig="$KUBECONFIG" delete -f "$f" --ignore-not-found; return; fi
	"$KUBECTL" --kubeconfig="$KUBECONFIG" apply -f "$f"
	for n in e2e-admin-pass-all e2e-baseline-pass-all; do
		"$KUBECTL" --kubeconfig="$KUBECONFIG" wait --for=condition=Accepted --timeout=60s "clusternetworkpolicy/$n"
	done
	echo ">> ClusterNetworkPolicies passing everything are present:"
	"$KUBECTL" --kubeconfig="$KUBECONFIG" get clusternetworkpolicies
}
if [ "${E2E_CNP_PASSALL:-0}" = 1 ]; then
	passall apply
	trap 'passall delete' EXIT
fi

failed=0
netpol_focus='\[sig-network\] Netpol'
conf_focus='\[sig-network\].*\[Conformance\]'
case $SUITE in
netpol) run netpol "${E2E_FOCUS:-$netpol_focus}" "${E2E_SKIP:-$skips}" ;;
conformance) run conformance "${E2E_FOCUS:-$conf_focus}" "${E2E_SKIP:-$skips}" ;;
all)
	run netpol "$netpol_focus" "$skips"
	run conformance "$conf_focus" "$skips"
	;;
*) echo "unknown E2E_SUITE $SUITE" >&2; exit 2 ;;
esac
exit $failed
