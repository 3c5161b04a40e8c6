#!/usr/bin/env bash
# Stop the node cluster of node-up.sh and remove everything it made (idempotent).
set -euo pipefail
cd "$(dirname "$0")/../.."
exec "${PYTHON:-python3}" -m tests.cluster node-down "$@"
