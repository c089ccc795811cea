#!/usr/bin/env bash
# Build the real control plane for the tests (tests/kubecluster: kube-apiserver, kube-scheduler and the
# resourceclaim controller from k8s.io/kubernetes, one binary) with progress on every long step.
# Usage: tests/kubecluster/build.sh OUTPUT. The first (cold) build downloads the modules go.sum pins and
# compiles about 2,000 packages: about 19 minutes of CPU (README, "Testing"); later builds reuse Go's caches
# (`go env GOMODCACHE GOCACHE`) and take seconds.
set -euo pipefail
out=$(realpath -m "$1")
cd "$(dirname "$0")"
export GOFLAGS='-mod=readonly -buildvcs=false'
t0=$SECONDS
echo "== [kubecluster 1/3] Go modules (k8s.io/kubernetes and its dependencies; cached in $(go env GOMODCACHE))"
go mod download
total=$(go list -deps . | wc -l)
echo "== [kubecluster 2/3] compiling: $total packages (cached ones are skipped; a cold build shows a line every 50)"
# -trimpath and -s -w: no paths or debug tables in the binary (smaller link, nothing of this machine inside)
go build -v -trimpath -ldflags='-s -w' -o "$out" . 2>&1 |
  awk -v total="$total" -v t0="$(date +%s)" '
    /^#|:[0-9]+:[0-9]+: / { print; next }        # a compiler message: show it whole
    { n++; if (n % 50 == 0) { printf "   %4d of at most %d packages compiled (%ds)\n", n, total, systime() - t0; fflush() } }
    END { if (n) printf "   %d packages compiled\n", n }'
echo "== [kubecluster 3/3] built $out in $((SECONDS - t0)) s"
