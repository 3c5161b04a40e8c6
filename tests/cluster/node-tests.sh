#!/usr/bin/env bash
# Everything the real-node tests need, then the tests (for CI; idempotent, cached):
#   Debian packages runc, containernetworking-plugins, debootstrap, iptables, buildah
#   build.sh --node (kubelet, kube-proxy, containerd v2, pause), the images
#   (pause; runtime and operator built by buildah from deploy/docker), pytest -m node,
#   and a final sweep so that no node of a killed run is left behind.
# Needs root.  Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY="${PYTHON:-python3}"
START=$SECONDS

pkgs=""
command -v runc >/dev/null || [[ -x /usr/sbin/runc ]] || pkgs="$pkgs runc"
[[ -x /usr/lib/cni/bridge || -x /opt/cni/bin/bridge ]] || pkgs="$pkgs containernetworking-plugins"
command -v iptables-restore >/dev/null || [[ -x /usr/sbin/iptables-restore ]] || pkgs="$pkgs iptables"
command -v debootstrap >/dev/null || [[ -x /usr/sbin/debootstrap ]] || pkgs="$pkgs debootstrap"
command -v buildah >/dev/null || pkgs="$pkgs buildah"
if [[ -n "$pkgs" ]]; then
    echo "[node-tests] apt-get install$pkgs" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $pkgs >/dev/null
fi
t=$SECONDS
bash tests/cluster/build.sh --node >/dev/null
echo "[node-tests] binaries ready in $((SECONDS - t))s" >&2
t=$SECONDS
"$PY" -m tests.cluster.images >/dev/null
echo "[node-tests] images ready in $((SECONDS - t))s" >&2
rc=0
"$PY" -m pytest -q -ra -m node tests/node "$@" || rc=$?
"$PY" -m tests.cluster node-down --all
echo "[node-tests] done in $((SECONDS - START))s (pytest exit $rc)" >&2
exit $rc
