#!/usr/bin/env bash
# Installs what a fresh Debian machine lacks, then configures and builds kvoffload.
#   tools/setup.sh [--python | --asan | --tsan | --deps-only]
#     --python     also prepares the Python reference environment and the real model of the
#                  end-to-end checks (tools/smollm2.sh)
#     --asan       a host-only clang build with AddressSanitizer and UndefinedBehaviorSanitizer,
#                  and the libFuzzer targets, in build-asan/: the library, tools and tests, no
#                  benchmarks and no Python
#     --tsan       a host-only clang build with ThreadSanitizer in build-tsan/: the library, the
#                  host backend's and the cache's tests, the host path's thread pool and kernels, and
#                  kvo-replay only
#     --deps-only  installs the packages and stops
# Environment: KVO_BUILD_DIR (default build, or build-asan / build-tsan), KVO_JOBS (default: number
# of cores), KVO_BUILD_TARGETS (the targets to build, default all; tools/run.sh builds
# kvo-generate alone).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mode=${1:-}
jobs=${KVO_JOBS:-$(nproc)}

packages=(cmake g++ make pkg-config libboost-dev libgtest-dev libbenchmark-dev nlohmann-json3-dev
          libcli11-dev libxxhash-dev libpcre2-dev libutf8proc-dev libsentencepiece-dev libopenblas-dev
          libcpp-httplib-dev xz-utils)
case "$mode" in
  --asan | --tsan) packages+=(clang-14 libclang-rt-14-dev) ;;
  "" | --python | --deps-only) ;;
  *)
    echo "tools/setup.sh: unknown option $mode (--python, --asan, --tsan or --deps-only)" >&2
    exit 2
    ;;
esac
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "kvoffload: installing ${missing[*]}" >&2
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
fi

[ "$mode" = "--deps-only" ] && exit 0

# Sanitizer builds: clang, optimized with line tables (reports name the lines), asserts kept.
sanitized=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang-14
           -DCMAKE_CXX_COMPILER=clang++-14 "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O2 -gline-tables-only"
           "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -gline-tables-only" -DKVO_WITH_CUDA=OFF
           -DKVO_BUILD_BENCHMARKS=OFF -DKVO_PYTHON= -DKVO_SMOLLM2_DIR=)
targets=()
case "$mode" in
  --asan)
    build=${KVO_BUILD_DIR:-$root/build-asan}
    cmake_args=("${sanitized[@]}" -DKVO_SANITIZE=address,undefined -DKVO_FUZZ=ON)
    ;;
  --tsan)
    build=${KVO_BUILD_DIR:-$root/build-tsan}
    cmake_args=("${sanitized[@]}" -DKVO_SANITIZE=thread)
    targets=(host_store_test host_backend_test window_layers_test cache_equivalence_test
             cache_bytes_test cache_misuse_test cache_context_test model_host_ops_test kvo-replay)
    ;;
  *)
    build=${KVO_BUILD_DIR:-$root/build}
    cmake_args=(-DCMAKE_BUILD_TYPE=Release)
    read -r -a targets <<<"${KVO_BUILD_TARGETS:-}"
    # With a CUDA compiler, FlashInfer's headers (fetched once per machine) for the attention
    # kernels; configuring fetches nothing itself.
    if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
      cmake_args+=(-DKVO_FLASHINFER_INCLUDE_DIR="$("$root/tools/flashinfer.sh")")
    fi
    if [ "$mode" = "--python" ]; then
      cmake_args+=(-DKVO_PYTHON="$("$root/tools/python-env.sh")/bin/python")
      cmake_args+=(-DKVO_SMOLLM2_DIR="$("$root/tools/smollm2.sh")")
    fi
    ;;
esac
cmake -S "$root" -B "$build" "${cmake_args[@]}" >/dev/null
if [ ${#targets[@]} -gt 0 ]; then
  cmake --build "$build" -j "$jobs" --target "${targets[@]}"
else
  cmake --build "$build" -j "$jobs"
fi
