#!/usr/bin/env bash
# Build (or locate) the binaries of the real Kubernetes test control plane.
#
#   kube-apiserver, kube-controller-manager, kube-scheduler  (k8s.io/kubernetes)
#   etcd                                                     (go.etcd.io/etcd/server/v3)
#   kwok                                                     (sigs.k8s.io/kwok, fake kubelet)
#
# With --node (or WITH_NODE=1) also what a real node needs:
#
#   kubelet, kube-proxy, kubectl                (k8s.io/kubernetes, same wrapper module)
#   containerd, ctr, containerd-shim-runc-v2    (github.com/containerd/containerd/v2)
#   pause                                       (tests/cluster/pause, our own few lines)
#
# runc, the CNI plugins and iptables (for kube-proxy) come from Debian packages
# (see node.py).
#
# Everything is built from the official Go modules through the Go module proxy
# and cached outside the repository, keyed by version:
#
#   ${JUPYTER_SANDBOX_CACHE:-$HOME/.cache/jupyter-sandbox}/k8s-v<K8S_VERSION>/bin
#   ${JUPYTER_SANDBOX_CACHE:-$HOME/.cache/jupyter-sandbox}/containerd-<CONTAINERD_VERSION>/bin
#
# GOMODCACHE and GOCACHE live under the same cache root, so a rebuild after a
# version bump reuses downloaded modules.  If KUBEBUILDER_ASSETS points at a
# directory that already holds a binary (setup-envtest ships etcd and
# kube-apiserver), that binary is used and not built.  The script is
# idempotent: a second run with everything present returns in well under a second.
#
# Prints the binary directory on its last line of stdout.
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-1.36.3}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
KWOK_VERSION="${KWOK_VERSION:-v0.8.0}"
CONTAINERD_VERSION="${CONTAINERD_VERSION:-v2.2.9}"
WITH_NODE="${WITH_NODE:-}"
for arg in "$@"; do
    case "$arg" in
        --node) WITH_NODE=1 ;;
        *) echo "usage: $0 [--node]" >&2; exit 2 ;;
    esac
done
CACHE_ROOT="${JUPYTER_SANDBOX_CACHE:-$HOME/.cache/jupyter-sandbox}"
BIN_DIR="$CACHE_ROOT/k8s-v$K8S_VERSION/bin"
SRC_DIR="$CACHE_ROOT/k8s-v$K8S_VERSION/src"
CTRD_DIR="$CACHE_ROOT/containerd-$CONTAINERD_VERSION/bin"
HERE="$(cd "$(dirname "$0")" && pwd)"
GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"

export GOMODCACHE="$CACHE_ROOT/gomodcache"
export GOCACHE="$CACHE_ROOT/gocache"
export GOTOOLCHAIN=local
export CGO_ENABLED=0
unset GOFLAGS

# staging modules of k8s.io/kubernetes 1.36 (published as v0.36.x)
STAGING="api apiextensions-apiserver apimachinery apiserver cli-runtime client-go
cloud-provider cluster-bootstrap code-generator component-base component-helpers
controller-manager cri-api cri-client cri-streaming csi-translation-lib
dynamic-resource-allocation endpointslice externaljwt kms kube-aggregator
kube-controller-manager kube-proxy kube-scheduler kubectl kubelet metrics
mount-utils pod-security-admission sample-apiserver sample-cli-plugin
sample-controller streaming"

K8S_BINS="kube-apiserver kube-controller-manager kube-scheduler"
CTRD_BINS="containerd ctr containerd-shim-runc-v2"
if [[ -n "$WITH_NODE" ]]; then K8S_BINS="$K8S_BINS kubelet kube-proxy kubectl"; fi
ALL_BINS="etcd kwok $K8S_BINS"
START=$SECONDS

log() { echo "[build.sh] $*" >&2; }

have_asset() {  # binary already provided by KUBEBUILDER_ASSETS?
    [[ -n "${KUBEBUILDER_ASSETS:-}" && -x "$KUBEBUILDER_ASSETS/$1" ]]
}

need() {  # should we build this binary?
    ! have_asset "$1" && [[ ! -x "$BIN_DIR/$1" ]]
}

need_node() {  # containerd and pause (only with --node)
    [[ -n "$WITH_NODE" ]] || return 1
    local b
    for b in $CTRD_BINS; do [[ -x "$CTRD_DIR/$b" ]] || return 0; done
    [[ -x "$BIN_DIR/pause" ]] || return 0
    return 1
}

# kwok needs Stage definitions (node init + heartbeat, pod ready/complete/delete);
# they ship in the kwok module, which the build has in GOMODCACHE.
STAGES="$BIN_DIR/kwok-stages.yaml"
write_kwok_stages() {
    [[ -s "$STAGES" ]] && return 0
    local src="$GOMODCACHE/sigs.k8s.io/kwok@$KWOK_VERSION/kustomize/stage" f
    [[ -d "$src" ]] || { log "kwok stages not found in $src"; return 1; }
    : >"$STAGES.tmp"
    for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
        pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
        { echo "---"; cat "$src/$f"; } >>"$STAGES.tmp"
    done
    mv "$STAGES.tmp" "$STAGES"
}

missing=""
for b in $ALL_BINS; do need "$b" && missing="$missing $b"; done
if need_node; then missing="$missing containerd/pause"; fi
if [[ -z "$missing" ]] && { have_asset kwok || [[ -s "$STAGES" ]] || write_kwok_stages; }; then
    log "all binaries present (${KUBEBUILDER_ASSETS:+KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS, }cache $BIN_DIR); took $((SECONDS - START))s"
    echo "$BIN_DIR"
    exit 0
fi

if [[ ! -x "$GO" ]]; then
    log "go toolchain not found (set GO=/path/to/go); cannot build:$missing"
    exit 1
fi

mkdir -p "$BIN_DIR" "$SRC_DIR" "$GOMODCACHE" "$GOCACHE"
# one build at a time per cache
exec 9>"$CACHE_ROOT/k8s-v$K8S_VERSION/.build.lock"
if ! flock -n 9; then
    log "another build holds the lock; waiting"
    flock 9
fi
log "building:$missing (go: $("$GO" version))"

LDFLAGS_COMMON="-s -w"

build_etcd() {
    local dir="$SRC_DIR/etcd"
    mkdir -p "$dir"
    cat >"$dir/go.mod" <<EOF
module jupyter-sandbox.test/etcd-build

go 1.26.0
EOF
    (
        cd "$dir"
        "$GO" get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >&2
        "$GO" build -mod=mod -trimpath -ldflags "$LDFLAGS_COMMON" \
            -o "$BIN_DIR/etcd.tmp" go.etcd.io/etcd/server/v3 >&2
    )
    mv "$BIN_DIR/etcd.tmp" "$BIN_DIR/etcd"
}

build_kwok() {
    GOBIN="$SRC_DIR/kwok-bin" "$GO" install -trimpath -ldflags "$LDFLAGS_COMMON" \
        "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION" >&2
    mv "$SRC_DIR/kwok-bin/kwok" "$BIN_DIR/kwok"
}

build_containerd() {
    # containerd's go.mod has no replace directives, so `go install pkg@version`
    # works.  Static (no cgo): btrfs/devmapper/zfs snapshotters are left out, the
    # overlayfs and native snapshotters and the CRI plugin are in.
    local p="github.com/containerd/containerd/v2"
    mkdir -p "$CTRD_DIR"
    GOBIN="$SRC_DIR/containerd-bin" "$GO" install -trimpath \
        -tags no_btrfs,no_devmapper,no_zfs,no_aufs \
        -ldflags "$LDFLAGS_COMMON -X $p/version.Version=$CONTAINERD_VERSION -X $p/version.Revision=module" \
        "$p/cmd/containerd@$CONTAINERD_VERSION" "$p/cmd/ctr@$CONTAINERD_VERSION" \
        "$p/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION" >&2
    local b
    for b in $CTRD_BINS; do mv "$SRC_DIR/containerd-bin/$b" "$CTRD_DIR/$b"; done
}

build_pause() {
    # the sandbox ("pause") container's process: our own few lines of Go, static
    local dir="$SRC_DIR/pause"
    mkdir -p "$dir"
    cp "$HERE/pause/main.go" "$dir/main.go"
    printf 'module jupyter-sandbox.test/pause\n\ngo 1.22\n' >"$dir/go.mod"
    (cd "$dir" && "$GO" build -trimpath -ldflags "$LDFLAGS_COMMON" -o "$BIN_DIR/pause.tmp" . >&2)
    mv "$BIN_DIR/pause.tmp" "$BIN_DIR/pause"
}

build_k8s() {
    local dir="$SRC_DIR/kubernetes" minor="${K8S_VERSION#*.}"
    minor="${minor%%.*}"
    local patch="${K8S_VERSION##*.}"
    mkdir -p "$dir"
    {
        echo "module jupyter-sandbox.test/k8s-build"
        echo
        echo "go 1.26.0"
        echo
        echo "require k8s.io/kubernetes v$K8S_VERSION"
        echo
        echo "replace ("
        for m in $STAGING; do echo "	k8s.io/$m => k8s.io/$m v0.$minor.$patch"; done
        echo ")"
    } >"$dir/go.mod"
    local v="v$K8S_VERSION"
    local ldflags="$LDFLAGS_COMMON"
    for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        ldflags="$ldflags -X $p.gitVersion=$v -X $p.gitMajor=1 -X $p.gitMinor=$minor"
        ldflags="$ldflags -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
    done
    local pkgs="" b
    for b in $K8S_BINS; do need "$b" && pkgs="$pkgs k8s.io/kubernetes/cmd/$b"; done
    (
        cd "$dir"
        rm -rf out && mkdir out
        # shellcheck disable=SC2086
        "$GO" build -mod=mod -trimpath -tags selinux,notest,grpcnotrace \
            -ldflags "$ldflags" -o out/ $pkgs >&2
    )
    for b in $K8S_BINS; do
        if [[ -x "$dir/out/$b" ]]; then mv "$dir/out/$b" "$BIN_DIR/$b"; fi
    done
}

t=$SECONDS
if need etcd; then build_etcd; log "etcd $ETCD_VERSION built in $((SECONDS - t))s"; fi
t=$SECONDS
if need kwok; then build_kwok; log "kwok $KWOK_VERSION built in $((SECONDS - t))s"; fi
t=$SECONDS
k8s_missing=""
for b in $K8S_BINS; do need "$b" && k8s_missing="$k8s_missing $b"; done
if [[ -n "$k8s_missing" ]]; then
    build_k8s
    log "kubernetes v$K8S_VERSION ($k8s_missing ) built in $((SECONDS - t))s"
fi

for b in $ALL_BINS; do
    if need "$b"; then log "ERROR: $b still missing"; exit 1; fi
done
if [[ -n "$WITH_NODE" ]]; then
    t=$SECONDS
    if [[ ! -x "$BIN_DIR/pause" ]]; then build_pause; log "pause built in $((SECONDS - t))s"; fi
    t=$SECONDS
    for b in $CTRD_BINS; do
        if [[ ! -x "$CTRD_DIR/$b" ]]; then
            build_containerd
            log "containerd $CONTAINERD_VERSION built in $((SECONDS - t))s"
            break
        fi
    done
fi
write_kwok_stages
log "done in $((SECONDS - START))s; binaries in $BIN_DIR"
echo "$BIN_DIR"
