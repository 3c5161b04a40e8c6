#!/usr/bin/env bash
# Build (or locate) the upstream agent-sandbox controller, the baseline of the
# claim-burst benchmark (benchmarks/kubernetes.py).
#
# It is installed by module path through the Go module proxy (the module has no
# replace directives) and cached outside the repository, beside the test control
# plane (tests/cluster/build.sh), sharing its GOMODCACHE and GOCACHE:
#
#   ${JUPYTER_SANDBOX_CACHE:-$HOME/.cache/jupyter-sandbox}/agent-sandbox-<version>/bin/agent-sandbox-controller
#
# Idempotent; prints the binary's path on its last line of stdout.
# --check only prints the path if it is already built (exit 1 otherwise).
set -euo pipefail

AGENT_SANDBOX_VERSION="${AGENT_SANDBOX_VERSION:-v0.5.6}"
CACHE_ROOT="${JUPYTER_SANDBOX_CACHE:-$HOME/.cache/jupyter-sandbox}"
BIN_DIR="$CACHE_ROOT/agent-sandbox-$AGENT_SANDBOX_VERSION/bin"
EXE="$BIN_DIR/agent-sandbox-controller"
GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"

if [[ -x "$EXE" ]]; then
    echo "$EXE"
    exit 0
fi
if [[ "${1:-}" == "--check" ]]; then
    echo "[build-upstream.sh] not built: $EXE" >&2
    exit 1
fi
if [[ ! -x "$GO" ]]; then
    echo "[build-upstream.sh] go toolchain not found (set GO=/path/to/go)" >&2
    exit 1
fi
export GOMODCACHE="$CACHE_ROOT/gomodcache"
export GOCACHE="$CACHE_ROOT/gocache"
export GOTOOLCHAIN=local
export CGO_ENABLED=0
unset GOFLAGS
mkdir -p "$BIN_DIR"
exec 9>"$BIN_DIR/.build.lock"
flock 9
if [[ -x "$EXE" ]]; then
    echo "$EXE"
    exit 0
fi
echo "[build-upstream.sh] building agent-sandbox-controller $AGENT_SANDBOX_VERSION (first run only)" >&2
start=$SECONDS
GOBIN="$BIN_DIR/.tmp" "$GO" install -trimpath -ldflags "-s -w" \
    "sigs.k8s.io/agent-sandbox/cmd/agent-sandbox-controller@$AGENT_SANDBOX_VERSION" >&2
mv "$BIN_DIR/.tmp/agent-sandbox-controller" "$EXE"
rmdir "$BIN_DIR/.tmp" 2>/dev/null || true
echo "[build-upstream.sh] built in $((SECONDS - start))s" >&2
echo "$EXE"
