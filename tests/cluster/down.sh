#!/usr/bin/env bash
# Stop the test control plane and remove its data (idempotent).
set -euo pipefail
cd "$(dirname "$0")/../.."
exec "${PYTHON:-python3}" -m tests.cluster down "$@"
