#!/usr/bin/env bash
# Build (or locate) helm for rendering deploy/helm/jupyter-sandbox in the tests.
#
# helm is a Go module; it is built through the Go module proxy, like the test
# control plane (tests/cluster/build.sh), and cached outside the repository:
#   ${JUPYTER_SANDBOX_CACHE:-$HOME/.cache/jupyter-sandbox}/helm-<version>/bin/helm
# A helm already on PATH is used as it is.  Prints the helm path on stdout.
set -euo pipefail

HELM_VERSION="${HELM_VERSION:-v4.3.2}"
CACHE_ROOT="${JUPYTER_SANDBOX_CACHE:-$HOME/.cache/jupyter-sandbox}"
BIN_DIR="$CACHE_ROOT/helm-$HELM_VERSION/bin"
GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"

if command -v helm >/dev/null 2>&1; then
    command -v helm
    exit 0
fi
if [[ -x "$BIN_DIR/helm" ]]; then
    echo "$BIN_DIR/helm"
    exit 0
fi
export GOMODCACHE="$CACHE_ROOT/gomodcache"
export GOCACHE="$CACHE_ROOT/gocache"
export GOTOOLCHAIN=local
export CGO_ENABLED=0
export GOBIN="$BIN_DIR"
unset GOFLAGS
mkdir -p "$BIN_DIR"
echo "[build-helm.sh] building helm $HELM_VERSION (first run only)" >&2
start=$SECONDS
"$GO" install -trimpath -ldflags "-s -w" "helm.sh/helm/v4/cmd/helm@$HELM_VERSION" >&2
echo "[build-helm.sh] built in $((SECONDS - start))s" >&2
echo "$BIN_DIR/helm"
