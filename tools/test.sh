#!/usr/bin/env bash
# Sets up a fresh machine (packages, Python reference environment), builds, and runs every test.
# Prints ctest's summary; exits non-zero when a test fails.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${KVO_BUILD_DIR:-$root/build}
"$root/tools/setup.sh" --python
ctest --test-dir "$build" --output-on-failure -j "${KVO_JOBS:-$(nproc)}" "$@"
