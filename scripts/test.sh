#!/usr/bin/env bash
# Run the test suite (as root: the network tests build namespaces). Extra arguments go
# to pytest, e.g. scripts/test.sh tests/test_cli.py, or scripts/test.sh --long for the
# long tier too (every figure's quick grid, the real-time onset searches; docs/tests.md).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${INCAST_VENV:-/opt/incast/venv}
exec "$venv/bin/python" -m pytest -ra --durations=30 "$@"
