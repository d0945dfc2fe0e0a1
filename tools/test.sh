#!/usr/bin/env bash
# Sets up a fresh machine, builds, and runs the tests; prints ctest's summary and exits non-zero
# when a test fails.
#   tools/test.sh [ctest options]          the full build with Python: every test
#   tools/test.sh --asan [ctest options]   build-asan/ (AddressSanitizer + UndefinedBehavior-
#                                          Sanitizer): the unit and tool tests, and each fuzz
#                                          target for KVO_FUZZ_SECONDS (5) on its corpus
#   tools/test.sh --tsan [ctest options]   build-tsan/ (ThreadSanitizer): the tests of the host
#                                          backend's threads, the cache's schedule and the host
#                                          path's thread pool
#   tools/test.sh --blas-kernels           the numeric tests of build/ (ctest -L numeric) under
#                                          each of OpenBLAS's Prescott, Haswell and SkylakeX
#                                          kernels this CPU can run (KVO_BLAS_CORETYPE), with
#                                          OPENBLAS_CORETYPE set to the same name in the
#                                          environment, which must change nothing
# A sanitizer's report fails the test it happens in.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
jobs=${KVO_JOBS:-$(nproc)}
case "${1:-}" in
  --asan)
    shift
    "$root/tools/setup.sh" --asan
    build=${KVO_BUILD_DIR:-$root/build-asan}
    cmake "$build" -DKVO_FUZZ_SECONDS="${KVO_FUZZ_SECONDS:-5}" >/dev/null
    export ASAN_OPTIONS=detect_leaks=1:exitcode=86:strict_string_checks=1
    export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:exitcode=87
    labels="unit|tool|fuzz"
    ;;
  --tsan)
    shift
    "$root/tools/setup.sh" --tsan
    build=${KVO_BUILD_DIR:-$root/build-tsan}
    export TSAN_OPTIONS=halt_on_error=1:exitcode=66:second_deadlock_stack=1
    labels="schedule"
    ;;
  --blas-kernels)
    shift
    build=${KVO_BUILD_DIR:-$root/build}
    [ -f "$build/CTestTestfile.cmake" ] || "$root/tools/setup.sh" --python
    flags=$(grep -m1 '^flags' /proc/cpuinfo || true)
    has() { for f in "$@"; do [[ " $flags " == *" $f "* ]] || return 1; done; }
    cores=(Prescott)
    has avx2 fma && cores+=(Haswell)
    has avx512f avx512bw avx512dq avx512vl && cores+=(SkylakeX)
    status=0
    for core in "${cores[@]}"; do
      echo "== numeric tests, OpenBLAS $core kernels (OPENBLAS_CORETYPE=$core in the environment)"
      KVO_BLAS_CORETYPE=$core OPENBLAS_CORETYPE=$core \
        ctest --test-dir "$build" --output-on-failure -j "$jobs" -L numeric "$@" || status=1
    done
    [ ${#cores[@]} -lt 3 ] && echo "== this CPU runs no AVX-512: SkylakeX's kernels were not run"
    exit $status
    ;;
  *)
    "$root/tools/setup.sh" --python
    build=${KVO_BUILD_DIR:-$root/build}
    labels=""
    ;;
esac
if [ -n "$labels" ]; then
  ctest --test-dir "$build" --output-on-failure -j "$jobs" -L "$labels" "$@"
else
  ctest --test-dir "$build" --output-on-failure -j "$jobs" "$@"
fi
