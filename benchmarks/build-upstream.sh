#!/usr/bin/env bash
# Build (or locate) an upstream agent-sandbox program, a baseline of the
# benchmarks:
#
#   build-upstream.sh [controller]   the controller (claim bursts, benchmarks/kubernetes.py)
#   build-upstream.sh router         the Go sandbox-router (router load, benchmarks/router_load.py)
#
# Each is installed by package path through the Go module proxy (the module has
# no replace directives) and cached outside the repository, beside the test
# control plane (tests/cluster/build.sh), sharing its GOMODCACHE and GOCACHE:
#
#   ${JUPYTER_SANDBOX_CACHE:-$HOME/.cache/jupyter-sandbox}/agent-sandbox-<version>/bin/<program>
#
# Idempotent; prints the binary's path on its last line of stdout.
# --check only prints the path if it is already built (exit 1 otherwise).
set -euo pipefail

AGENT_SANDBOX_VERSION="${AGENT_SANDBOX_VERSION:-v0.5.6}"
CACHE_ROOT="${JUPYTER_SANDBOX_CACHE:-$HOME/.cache/jupyter-sandbox}"
BIN_DIR="$CACHE_ROOT/agent-sandbox-$AGENT_SANDBOX_VERSION/bin"
CHECK=""
WHAT=controller
for arg in "$@"; do
    case "$arg" in
        --check) CHECK=1 ;;
        controller|router) WHAT="$arg" ;;
        *) echo "usage: build-upstream.sh [controller|router] [--check]" >&2; exit 2 ;;
    esac
done
if [[ "$WHAT" == router ]]; then
    PKG="sigs.k8s.io/agent-sandbox/sandbox-router/cmd"
    BUILT=cmd  # go install names the binary after the package directory
    EXE="$BIN_DIR/sandbox-router"
else
    PKG="sigs.k8s.io/agent-sandbox/cmd/agent-sandbox-controller"
    BUILT=agent-sandbox-controller
    EXE="$BIN_DIR/agent-sandbox-controller"
fi
GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"

if [[ -x "$EXE" ]]; then
    echo "$EXE"
    exit 0
fi
if [[ -n "$CHECK" ]]; then
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
echo "[build-upstream.sh] building $PKG $AGENT_SANDBOX_VERSION (first run only)" >&2
start=$SECONDS
GOBIN="$BIN_DIR/.tmp" "$GO" install -trimpath -ldflags "-s -w" "$PKG@$AGENT_SANDBOX_VERSION" >&2
mv "$BIN_DIR/.tmp/$BUILT" "$EXE"
rmdir "$BIN_DIR/.tmp" 2>/dev/null || true
echo "[build-upstream.sh] built in $((SECONDS - start))s" >&2
echo "$EXE"
