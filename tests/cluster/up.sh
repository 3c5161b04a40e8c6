#!/usr/bin/env bash
# Start the test control plane (idempotent); prints the kubeconfig path.
set -euo pipefail
cd "$(dirname "$0")/../.."
exec "${PYTHON:-python3}" -m tests.cluster up "$@"
