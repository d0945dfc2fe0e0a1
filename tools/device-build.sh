#!/usr/bin/env bash
# Packs what tools/device-check.sh runs on a GPU machine into one archive, built on this machine
# (which needs no GPU): at most 40 MiB, since everything that travels there, the working tree
# included, may be 64 MiB. It holds carry/:
#   bin/        the CUDA tests, the benchmarks, kvo-generate and kvo-replay, stripped
#   lib/        every shared library they load besides glibc, the NVIDIA driver and cuBLAS:
#               Google Benchmark, the tokenizers' PCRE2, utf8proc, SentencePiece and protobuf-lite,
#               the C++ runtime, and OpenBLAS with libgfortran (loaded at run time, not linked)
#   wheel/      the Python package's wheel (pyproject.toml, built with CUDA), which the GPU
#               machine installs as a user would, beside its own PyTorch: it links no torch
#   commit, MANIFEST
# Nothing is compiled or configured on the GPU machine. cuBLAS is the GPU
# machine's own: tools/device-check.sh looks for libcublas.so.13 in the CUDA toolkit's lib64 and
# then in the nvidia-cublas wheel beside PyTorch, and stops, naming both places, where it finds
# neither.
#
#   tools/device-build.sh [--build DIR] [--out FILE] [--max-mib N]
#     --build    a CUDA build tree (default build/: tools/test.sh configures it for sm_90 and its
#                PTX on a machine without a GPU); one that is not a CUDA build for sm_90 is
#                replaced by build-device/, configured here
#     --out      the archive (default: DIR/device-carry.tar.xz)
#     --max-mib  the size it must not pass (default 40)
# Environment: KVO_JOBS (default: the number of cores).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$root/build
out=""
max_mib=40
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --max-mib) max_mib=$2; shift 2 ;;
    --help | -h) sed -n '2,27p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "device-build: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
jobs=${KVO_JOBS:-$(nproc)}
start=$SECONDS
"$root/tools/setup.sh" --deps-only  # xz, binutils' strip, and what a build needs

cached() { grep -s "^$1:" "$build/CMakeCache.txt" | cut -d= -f2-; }
if [ "$(cached KVO_WITH_CUDA)" != ON ] || [[ ";$(cached CMAKE_CUDA_ARCHITECTURES);" != *";90"* ]]; then
  echo "device-build: $build is not a CUDA build for sm_90; configuring $root/build-device" >&2
  build=$root/build-device
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DKVO_WITH_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DKVO_FLASHINFER_INCLUDE_DIR="$("$root/tools/flashinfer.sh")" \
    -DKVO_PYTHON= -DKVO_SMOLLM2_DIR= >/dev/null
fi
if [ "$(cached KVO_FLASHINFER)" != ON ]; then
  echo "device-build: $build compiles no FlashInfer (KVO_FLASHINFER is not ON), and the device" \
       "check measures its kernels; configure it with" \
       "-DKVO_FLASHINFER_INCLUDE_DIR=\"\$(bash tools/flashinfer.sh)\" -DKVO_WITH_FLASHINFER=ON" >&2
  exit 1
fi
out=${out:-$build/device-carry.tar.xz}

targets=(cuda_cache_test model_cuda_test model_cuda_attention_test model_cuda_quant_test
         model_cuda_blocks_test kvo-generate kvo-replay kvo_bench_bandwidth kvo_bench_decode_compare kvo_bench_attention)
cmake --build "$build" -j "$jobs" --target "${targets[@]}" >/dev/null

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
carry=$stage/carry
mkdir -p "$carry/bin" "$carry/lib"
for t in "${targets[@]}"; do
  file=$(find "$build" -type f -name "$t" -perm -u+x -not -path "*/CMakeFiles/*" -print -quit)
  [ -n "$file" ] || { echo "device-build: $t was not built in $build" >&2; exit 1; }
  strip -o "$carry/bin/$t" "$file"
done
# OpenBLAS is loaded at run time (model/host/blas.hpp), so ldd does not list it: carried by name, with
# what it loads itself. libstdc++ and libgcc_s travel too (the device machine's may be older than
# this compiler's); device-check.sh puts the carried libraries on the carried binaries' path alone,
# so the machine's own programs keep the machine's own.
openblas="$(pkg-config --variable=libdir openblas)/libopenblas.so.0"
cp -L "$openblas" "$carry/lib/libopenblas.so.0"
for f in "$carry"/bin/* "$carry/lib/libopenblas.so.0"; do
  ldd "$f" | awk '$3 ~ /^\// {print $3}'
done | sort -u | grep -v '/libopenblas' |
  grep -vE '/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*|libcuda|libcublas[^/]*|libcudart)\.so' |
  while read -r lib; do cp -L "$lib" "$carry/lib/"; done
strip --strip-unneeded "$carry"/lib/* 2>/dev/null || true
# The wheel a user's `pip wheel .` makes, with the CUDA backend (its build kept beside the tree's
# build, so a second run is incremental).
"$("$root/tools/python-env.sh")/bin/python" -m pip wheel --quiet --disable-pip-version-check \
  --no-deps --wheel-dir "$carry/wheel" -C build-dir="$build/wheel-build" \
  -C cmake.define.KVO_WITH_CUDA=ON "$root" >/dev/null
git -C "$root" rev-parse HEAD >"$carry/commit" 2>/dev/null || echo unknown >"$carry/commit"
(cd "$carry" && find . -type f -printf '%s %p\n' | sort -k2) >"$carry/MANIFEST"

tar -C "$stage" -cf - carry | xz -6 -T "$jobs" >"$out.partial"
mv "$out.partial" "$out"
bytes=$(stat -c %s "$out")
unpacked=$(du -sb "$carry" | cut -f1)
awk -v out="$out" -v b="$bytes" -v u="$unpacked" -v n="$(find "$carry" -type f | wc -l)" \
  -v s=$((SECONDS - start)) 'BEGIN { printf "device-build: %s: %.1f MiB (%.1f MiB unpacked, %d files), sm_90 + compute_90 PTX, in %d s\n", out, b / 1048576, u / 1048576, n, s }' 
if [ "$bytes" -gt $((max_mib * 1048576)) ]; then
  echo "device-build: the archive passes $max_mib MiB: it would not travel with the tree" >&2
  exit 1
fi
