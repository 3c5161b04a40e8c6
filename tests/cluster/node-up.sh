#!/usr/bin/env bash
# Start a control plane (no kwok) plus one real node: containerd, runc, CNI,
# kubelet (idempotent); prints the kubeconfig path.  Needs root, the binaries
# of `tests/cluster/build.sh --node` and the Debian packages named in node.py.
set -euo pipefail
cd "$(dirname "$0")/../.."
exec "${PYTHON:-python3}" -m tests.cluster node-up "$@"
