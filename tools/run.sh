#!/usr/bin/env bash
# Sets up a fresh machine, builds, and runs the main job. Arguments go to the program.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${KVO_BUILD_DIR:-$root/build}
"$root/tools/setup.sh" >&2
exec "$build/tools/kvo-replay" "$@"
