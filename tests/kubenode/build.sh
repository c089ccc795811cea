#!/usr/bin/env bash
# Build the real node for the tests (tests/support/kube_node.py) with progress on every long step:
#   OUTDIR/kubelet                  the kubelet from k8s.io/kubernetes (this folder's module: cmd/kubelet's main)
#   OUTDIR/containerd, OUTDIR/containerd-shim-runc-v2, OUTDIR/ctr
#                                   containerd 2.x from its own Go module, at CONTAINERD_VERSION, its go.mod
#                                   as released (go install module@version: checksums from go.sum's database)
# runc is not built here: it is Debian's package (`apt-get install runc`); the tests skip without it.
# Usage: tests/kubenode/build.sh OUTDIR. Cold: README, "Testing" gives the measured time; warm: seconds.
set -euo pipefail
CONTAINERD_VERSION=v2.4.2
out=$(realpath -m "$1")
cd "$(dirname "$0")"
mkdir -p "$out"
export GOFLAGS='-mod=readonly -buildvcs=false'
# At most two packages compiled at once (the test machine has 2 cores); override with GOBUILD_P.
p="-p ${GOBUILD_P:-2}"
t0=$SECONDS

# progress: a line every 50 compiled packages (go build -v names each one it compiles; cached ones are silent)
progress() {
  awk -v total="$1" -v t0="$(date +%s)" '
    /^#|:[0-9]+:[0-9]+: / { print; next }        # a compiler message: show it whole
    { n++; if (n % 50 == 0) { printf "   %4d of at most %d packages compiled (%ds)\n", n, total, systime() - t0; fflush() } }
    END { if (n) printf "   %d packages compiled\n", n }'
}

echo "== [kubenode 1/4] Go modules (k8s.io/kubernetes and containerd $CONTAINERD_VERSION; cached in $(go env GOMODCACHE))"
go mod download
cd_mod=github.com/containerd/containerd/v2
go mod download "$cd_mod@$CONTAINERD_VERSION"

# containerd as its Makefile builds it, minus cgo-only parts: no_btrfs (needs btrfs headers), and the shim
# without gRPC (no_grpc, as the Makefile's SHIM_GO_TAGS). GOBIN=OUTDIR: go install names them after their cmd/.
tags='urfave_cli_no_docs no_btrfs'
echo "== [kubenode 2/4] compiling containerd $CONTAINERD_VERSION and ctr (a cold build shows a line every 50 packages)"
dir=$(go mod download -json "$cd_mod@$CONTAINERD_VERSION" | sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p')
total=$(cd "$dir" && GOFLAGS=-mod=mod go list -tags "$tags" -deps ./cmd/containerd ./cmd/ctr 2>/dev/null | wc -l)
GOBIN="$out" go install $p -v -trimpath -tags "$tags" -ldflags='-s -w' \
  "$cd_mod/cmd/containerd@$CONTAINERD_VERSION" "$cd_mod/cmd/ctr@$CONTAINERD_VERSION" 2>&1 | progress "$total"
echo "== [kubenode 3/4] compiling containerd-shim-runc-v2 $CONTAINERD_VERSION"
GOBIN="$out" CGO_ENABLED=0 go install $p -v -trimpath -tags "$tags no_grpc" -ldflags='-s -w' \
  "$cd_mod/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION" 2>&1 | progress "$total"
# The kubelet last: its file is make's target, so it is new only when all four are built.
total=$(go list -deps . | wc -l)
echo "== [kubenode 4/4] compiling the kubelet: $total packages (cached ones are skipped; a cold build shows a line every 50)"
go build $p -v -trimpath -ldflags='-s -w' -o "$out/kubelet" . 2>&1 | progress "$total"

echo "== [kubenode] built $out/{kubelet,containerd,containerd-shim-runc-v2,ctr} in $((SECONDS - t0)) s"
