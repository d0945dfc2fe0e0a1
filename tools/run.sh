#!/usr/bin/env bash
# Sets up a fresh machine, builds, and runs the main job: long-context generation with
# kvo-generate, on the GPU when there is one and on the host backend otherwise.
# Without arguments: the built-in tiny model, a 4096-token prompt, 32 new tokens, one layer
# resident and the rest streamed through a ring of two staging buffers. Arguments replace that
# and go to kvo-generate as they are (see --help).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${KVO_BUILD_DIR:-$root/build}
KVO_BUILD_TARGETS=kvo-generate "$root/tools/setup.sh" >&2  # the rest is built by tools/test.sh
if [ $# -eq 0 ]; then
  set -- --preset tiny --prompt-len 4096 --max-new 32 --resident 1 --ring 2
fi
exec "$build/tools/kvo-generate" "$@"
