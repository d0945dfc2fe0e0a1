#!/usr/bin/env bash
# Builds, on a machine without a GPU, what tools/device-check.sh runs on a machine with one: the
# CUDA tests, the benchmarks and the tools, for Hopper (sm_90, the H100/H200) with PTX beside it,
# into one folder small enough to carry over (stripped binaries, Google Benchmark's shared
# library, and FlashInfer's headers for a rebuild there). GoogleTest links statically; the
# device machine needs only the NVIDIA driver and the CUDA 13 runtime libraries (cuBLAS).
#   tools/device-build.sh [BUILD_DIR]      (default: build-device)
# Environment: KVO_DEVICE_ARCHITECTURES (default "90-real;90-virtual"), KVO_JOBS.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${1:-$root/build-device}
jobs=${KVO_JOBS:-$(nproc)}
"$root/tools/setup.sh" --deps-only
flashinfer=$("$root/tools/flashinfer.sh")
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DKVO_WITH_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES="${KVO_DEVICE_ARCHITECTURES:-90-real;90-virtual}" \
  -DKVO_FLASHINFER_INCLUDE_DIR="$flashinfer" -DKVO_PYTHON= -DKVO_SMOLLM2_DIR= >/dev/null
targets=(cuda_cache_test model_cuda_test model_cuda_attention_test kvo_bench_bandwidth
         kvo_bench_decode_compare kvo_bench_attention kvo-replay kvo-generate)
cmake --build "$build" -j "$jobs" --target "${targets[@]}"
carry=$build/carry
rm -rf "$carry"
mkdir -p "$carry/bin" "$carry/lib"
for t in "${targets[@]}"; do
  file=$(find "$build" -type f -name "$t" -perm -u+x -not -path "*/carry/*" | head -n1)
  strip -o "$carry/bin/$t" "$file"
done
# The shared libraries the binaries load besides glibc and the CUDA driver/toolkit (Google
# Benchmark, the tokenizers' PCRE2, utf8proc, SentencePiece and protobuf-lite, the C++ runtime):
# the device machine need not have them.
# OpenBLAS is loaded at run time (model/blas.hpp), not linked, so ldd does not list it: it is
# carried by name with what it loads itself (libgfortran), and found there through
# LD_LIBRARY_PATH (tools/device-check.sh sets it). cuBLAS, loaded the same way, is the toolkit's.
openblas="$(pkg-config --variable=libdir openblas)/libopenblas.so.0"
cp -L "$openblas" "$carry/lib/libopenblas.so.0"
for f in "$carry"/bin/* "$carry/lib/libopenblas.so.0"; do
  ldd "$f" | awk '$3 ~ /^\// {print $3}'
done | sort -u | grep -v '/libopenblas' | grep -vE '/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*|libcuda|libcublas[^/]*|libcudart)\.so' |
  while read -r lib; do cp -L "$lib" "$carry/lib/"; done
cp -r "$flashinfer" "$carry/flashinfer-include"
git -C "$root" rev-parse HEAD >"$carry/commit" 2>/dev/null || echo unknown >"$carry/commit"
echo "device build in $carry ($(du -sh "$carry" | cut -f1)); carry it and run:" >&2
echo "  tools/device-check.sh --build $carry" >&2
