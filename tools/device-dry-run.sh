#!/usr/bin/env bash
# Runs the archive of tools/device-build.sh as a GPU machine without our packages would: unpacked
# into an empty root that holds nothing but glibc (what every Linux image has) and a shell, with
# /proc mounted, entered with chroot, the search path pointing at the carried lib/ alone. There
# kvo-generate runs a short generation on the host backend, every carried test binary runs to
# its GPU check (skipping without a GPU, and failing with KVO_REQUIRE_CUDA=1, naming it), and
# every benchmark prints its options. Needs root (chroot, mount); without it, it says so and
# checks only that every library the binaries load resolves into lib/ or glibc.
#   tools/device-dry-run.sh [ARCHIVE]     (default: build/device-carry.tar.xz)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
archive=${1:-$root/build/device-carry.tar.xz}
[ -f "$archive" ] || { echo "device-dry-run: no archive at $archive (tools/device-build.sh)" >&2; exit 2; }
work=$(mktemp -d)
cleanup() {
  umount "$work/proc" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
tar -C "$work" -xJf "$archive"
carry=$work/carry
tests=(cuda_cache_test model_cuda_test model_cuda_attention_test model_cuda_quant_test
       model_cuda_blocks_test)
benches=(kvo_bench_bandwidth kvo_bench_decode_compare kvo_bench_attention)
status=0

# glibc's libraries, which a GPU machine's image has: the loader, libc, libm, libdl, librt and
# libpthread, nothing else of this machine.
glibc=(/lib64/ld-linux-x86-64.so.2)
for name in libc.so.6 libm.so.6 libdl.so.2 librt.so.1 libpthread.so.0; do
  # awk reads to the end: leaving early would kill ldconfig with SIGPIPE, which pipefail reports
  # once its listing outgrows the pipe's buffer.
  glibc+=("$(ldconfig -p | awk -v n="$name" '$1 == n && /x86-64/ && !found {print $NF; found = 1}')")
done

is_glibc() {
  local g
  for g in "${glibc[@]}"; do [ "$g" = "$1" ] && return 0; done
  return 1
}

if [ "$(id -u)" -ne 0 ] || ! mkdir -p "$work/proc" || ! mount -t proc proc "$work/proc" 2>/dev/null; then
  echo "device-dry-run: not root, or /proc cannot be mounted: checking library resolution only" >&2
  for f in "$carry"/bin/* "$carry"/lib/*.so*; do
    while read -r lib; do
      case "$lib" in
        "$carry"/lib/*) ;;
        *) if ! is_glibc "$(readlink -f "$lib")" && ! is_glibc "$lib"; then
             echo "device-dry-run: $(basename "$f") loads $lib from this machine" >&2
             status=1
           fi ;;
      esac
    done < <(LD_LIBRARY_PATH="$carry/lib" ldd "$f" 2>/dev/null | awk '$3 ~ /^\// {print $3}')
  done
  [ $status = 0 ] && echo "device-dry-run: every library resolves into lib/ or glibc"
  exit $status
fi

# The empty root: glibc, a shell, /tmp and the few device nodes a program opens.
mkdir -p "$work"/{lib64,lib/x86_64-linux-gnu,bin,tmp,dev}
for lib in "${glibc[@]}"; do cp -L "$lib" "$work$lib"; done
cp -L /bin/sh "$work/bin/sh"
for lib in $(ldd /bin/sh | awk '$3 ~ /^\// {print $3}'); do cp -nL "$lib" "$work$lib"; done
for node in null zero urandom full; do
  cp -a "/dev/$node" "$work/dev/$node" 2>/dev/null || : >"$work/dev/$node"
done
in_root() { chroot "$work" /usr/bin/env -i LD_LIBRARY_PATH=/carry/lib PATH=/carry/bin "$@"; }
mkdir -p "$work/usr/bin"
cp -L /usr/bin/env "$work/usr/bin/env"
for lib in $(ldd /usr/bin/env | awk '$3 ~ /^\// {print $3}'); do cp -nL "$lib" "$work$lib"; done

echo "== kvo-generate --backend host --preset tiny, in a root with glibc and the archive alone"
if ! in_root /carry/bin/kvo-generate --backend host --preset tiny --prompt-len 512 --max-new 8 \
     --json; then
  echo "device-dry-run: kvo-generate failed" >&2
  status=1
fi
for t in "${tests[@]}"; do
  echo "== $t: its CUDA tests skip without a GPU, and fail with KVO_REQUIRE_CUDA=1"
  if ! out=$(in_root /carry/bin/"$t" --gtest_filter='Cuda*' 2>&1); then
    echo "$out" | tail -n 20
    echo "device-dry-run: $t failed without a GPU" >&2
    status=1
  elif ! grep -q "SKIPPED" <<<"$out"; then
    echo "device-dry-run: $t ran no CUDA test and skipped none" >&2
    status=1
  else
    grep -E "^\[  (PASSED|SKIPPED) " <<<"$out" || true
  fi
  if out=$(in_root KVO_REQUIRE_CUDA=1 /carry/bin/"$t" --gtest_filter='Cuda*' 2>&1) ||
     ! grep -q "KVO_REQUIRE_CUDA=1" <<<"$out"; then
    echo "device-dry-run: with KVO_REQUIRE_CUDA=1, $t did not fail naming it" >&2
    status=1
  fi
done
for b in "${benches[@]}"; do
  echo "== $b starts (kvo_bench_attention then stops: it needs a GPU)"
  out=$(in_root /carry/bin/"$b" --help 2>&1) && rc=0 || rc=$?
  # cuBLAS comes from the GPU machine (kvo_bench_attention links it for its GEMM figure): the only
  # library this root may lack.
  missing=$(grep -o "error while loading shared libraries: [^:]*" <<<"$out" | awk '{print $NF}' ||
            true)
  if [ -n "$missing" ] && [[ $missing == libcublas* ]]; then
    echo "$b: needs $missing, which the GPU machine's CUDA toolkit gives it"
  elif [ $rc = 127 ] || [ -n "$missing" ]; then
    echo "$out" | tail -n 3
    echo "device-dry-run: $b does not load" >&2
    status=1
  fi
done
[ $status = 0 ] && echo "device-dry-run: the archive runs with nothing of this machine but glibc"
exit $status
