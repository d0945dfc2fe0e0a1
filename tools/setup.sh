#!/usr/bin/env bash
# Installs what a fresh Debian machine lacks, then configures and builds kvoffload.
#   tools/setup.sh [--python]   --python also prepares the Python reference environment and
#                               the real model of the end-to-end checks (tools/smollm2.sh)
# Environment: KVO_BUILD_DIR (default build), KVO_JOBS (default: number of cores).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${KVO_BUILD_DIR:-$root/build}
jobs=${KVO_JOBS:-$(nproc)}

packages=(cmake g++ make pkg-config libboost-dev libgtest-dev libbenchmark-dev libopenblas-dev)
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

cmake_args=(-S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release)
if [ "${1:-}" = "--python" ]; then
  cmake_args+=(-DKVO_PYTHON="$("$root/tools/python-env.sh")/bin/python")
  cmake_args+=(-DKVO_SMOLLM2_DIR="$("$root/tools/smollm2.sh")")
fi
cmake "${cmake_args[@]}" >/dev/null
cmake --build "$build" -j "$jobs"
