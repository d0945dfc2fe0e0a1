#!/usr/bin/env bash
# The one check to run on a machine with a GPU: every CUDA path proven or disproven and its
# figures judged, under one deadline. It runs the archive tools/device-build.sh makes (carried
# over with the tree; nothing is configured or compiled there: the Python package is the carried
# wheel, installed beside that machine's own PyTorch). In order: what has never run first, then the new
# paths, then the long figures:
#   env        the GPU, driver, PCIe link, CPUs and memory; cuBLAS found (the toolkit's lib64,
#              then the nvidia-cublas wheel beside PyTorch)
#   smoke      a one-second kvo-replay on CUDA
#   tests      the CUDA tests of the cache, the ring, the decoder, attention, quantized rows,
#              sampling and GGUF blocks, with KVO_REQUIRE_CUDA=1 (a missing GPU fails them
#              instead of skipping)
#   dropin     the carried wheel installed there (pip, no index, beside the machine's PyTorch),
#              and tests/python/test_hf_cuda.py with KVO_REQUIRE_CUDA=1; SKIPPED, with the reason,
#              where the machine has no transformers 5.24 or later
#   split      kvo-generate at 128K, every layer streamed, --split off and --split auto
#   bandwidth  pinned H2D and D2H copies
#   attention  the attention kernels alone (bf16, then int8 over bf16 tiles) against the HBM copy
#              and the bf16 GEMM rate measured in the same run
#   decode     the decode step, every layer streamed, against the bytes over the measured
#              bandwidth (bf16, then int8), beside all-resident and a transformers-like cache
#   replay     kvo-replay at the longest context, every layer streamed, bytes checked
#   generate   kvo-generate --preset llama3-8b at 32K under a 24 GiB budget
#   prefill    a 128K prompt of the same, bf16 then int8 K/V
#   memcheck   compute-sanitizer --tool memcheck, then racecheck, over a few small tests
#   racecheck  (a report fails the step; a GPU it does not serve skips them, with its answer)
# Each step gets its share of what is left of the deadline; a step that no longer fits is
# skipped with a line saying so, and one the deadline cuts is SKIPPED too (what it left is not
# judged); one stopped by its own share says so and fails. The judge (tools/device_judge.py)
# holds every figure to its band (bench/results/expected-h100.md or expected-h200.md, by the
# GPU's name) and exits non-zero on a failed test, a benchmark that threw, a byte-model
# mismatch, a figure outside its band, or a step skipped for a missing binary (status 1,
# headline FAIL); with nothing failed but something skipped for time, for a prerequisite of the
# machine, or left out with --only, it exits 3 (headline INCOMPLETE); only a whole run exits 0
# (PASS). At most five files are written to --out, all but failed.log rewritten whole after
# every step (a run killed at its call's limit returns all it finished): steps.tsv (each step's
# verdict, seconds and note), device-check.json (every figure, band and verdict, the commit,
# GPU, driver, PCIe link, MemTotal and MemAvailable), summary.md (PASS, FAIL or SKIPPED per
# line, expected beside measured), logs.tar.gz (every step's log and output) and, when a step
# failed, failed.log (the end of each failed step's log).
#
#   tools/device-check.sh [--archive FILE | --build DIR] [--out DIR] [--deadline SECONDS]
#                         [--backend cuda|host] [--small] [--only STEP,STEP...] [--bands FILE]
#                         [--set KEY=VALUE] [--host-memory BYTES]
#
#   --archive  the archive of tools/device-build.sh (default build/device-carry.tar.xz)
#   --build    a build tree or an unpacked carry/ instead of the archive
#   --out      where the files go (default $OUT, else out/)
#   --deadline the whole run's limit, in seconds (default 420)
#   --backend  host: the steps that do not need a GPU, on the host backend (with --small, the
#              CI check that keeps this script from rotting)
#   --small    small shapes and contexts: seconds, on either backend
#   --only     run these steps alone (the others are skipped: a second run can take the rest)
#   --bands    the bands file (default: expected-h100.md on an H100, else expected-h200.md;
#              expected-small.md with --small, on either backend)
#   --set      passed to the judge: a measured figure replaced (a test of the judge)
#   --host-memory  what the machine can give the pinned stores (KVO_HOST_MEMORY, e.g. 120GiB), for
#              a virtual machine whose memory grows as it is used: there even MemTotal starts far
#              below what it gives, and the 128K stores would be refused. Default on a GPU run at
#              full size: 120GiB where /proc/meminfo's MemTotal is below it (the lent machines
#              give 128 GiB), else what the library reads; env.json records which
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
archive=$root/build/device-carry.tar.xz
build=""
out=${OUT:-$root/out}
deadline=420
backend=cuda
small=0
only=""
bands=""
judge_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --archive) archive=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --deadline) deadline=$2; shift 2 ;;
    --backend) backend=$2; shift 2 ;;
    --small) small=1; shift ;;
    --only) only=",$2,"; shift 2 ;;
    --bands) bands=$2; shift 2 ;;
    --set) judge_args+=(--set "$2"); shift 2 ;;
    --host-memory) export KVO_HOST_MEMORY=$2; shift 2 ;;
    --help | -h) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' \
                   "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "device-check: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$backend" in cuda | host) ;; *) echo "device-check: --backend cuda or host" >&2; exit 2 ;; esac
if [ "$backend" = cuda ] && [ "$small" = 0 ] && [ -z "${KVO_HOST_MEMORY:-}" ]; then
  total_kib=$(awk '/^MemTotal:/ { print $2 }' /proc/meminfo 2>/dev/null)
  if [ -n "$total_kib" ] && [ "$total_kib" -lt $((120 * 1024 * 1024)) ]; then
    export KVO_HOST_MEMORY=120GiB  # a VM that grows: MemTotal is not yet what it gives
    export KVO_HOST_MEMORY_DEFAULTED=1  # recorded in env.json
  fi
fi
[[ $deadline =~ ^[0-9]+$ ]] || { echo "device-check: --deadline takes seconds" >&2; exit 2; }
if [ -z "$bands" ]; then
  # Each card's bands from its own rates: an H100's HBM3 is slower than an H200's HBM3e.
  gpu_name=$(timeout 20 nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | sed -n 1p)
  case "$gpu_name" in
    *H100*) bands=$root/bench/results/expected-h100.md ;;
    *) bands=$root/bench/results/expected-h200.md ;;
  esac
  [ "$small" = 1 ] && bands=$root/bench/results/expected-small.md
fi
start=$SECONDS
reserve=20  # kept for the judge and the archive of logs
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
logs=$work/logs
mkdir -p "$logs" "$out"
rm -f "$out"/device-check.json "$out"/summary.md "$out"/logs.tar.gz "$out"/failed.log \
  "$out"/steps.tsv "$out"/*.part

left() { echo $((deadline - reserve - (SECONDS - start))); }
# What is finished reaches --out at once: after every step, the steps so far, the judge's summary
# and JSON of them and the logs, each replaced whole, so that a run killed at its call's limit
# still returns everything it measured (what was still running is judged SKIPPED, INCOMPLETE).
# steps.tsv goes last: a step named there is in the summary, the JSON and the logs too.
publish() {
  [ -f "$work/steps.tsv" ] || return 0
  cp "$work"/*.json "$logs/" 2>/dev/null
  python3 "$root/tools/device_judge.py" --work "$work" --bands "$bands" --out "$out" \
    "${judge_args[@]}" >"$logs/judge.log" 2>&1
  tar -C "$work" -czf "$out/logs.tar.gz.part" logs 2>/dev/null &&
    mv "$out/logs.tar.gz.part" "$out/logs.tar.gz"
  cp "$work/steps.tsv" "$out/steps.tsv.part" && mv "$out/steps.tsv.part" "$out/steps.tsv"
}
record() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >>"$work/steps.tsv"; }
say() { echo "== [$((SECONDS - start)) s] $*" >&2; }

# step NAME SHARE BINARY... -- COMMAND...: runs COMMAND with `timeout` of the smaller of SHARE and
# what is left, its output in logs/NAME.log; a BINARY that is missing skips it, as a failure.
step() {
  local name=$1 share=$2 bins=() limit rc t0
  shift 2
  while [ "$1" != "--" ]; do bins+=("$1"); shift; done
  shift
  if [ -n "$only" ] && [[ $only != *",${name%%_*},"* ]] && [[ $only != *",$name,"* ]]; then
    record "$name" SKIPPED 0 "not in --only"
    return 0
  fi
  for b in "${bins[@]}"; do
    if ! bin_path "$b" >/dev/null; then
      say "$name: SKIPPED, $b missing"
      record "$name" SKIPPED 0 "binary $b missing"
      return 1
    fi
  done
  limit=$(left)
  local cut=0  # the deadline, not the step's share, sets its limit
  if [ "$limit" -gt "$share" ]; then limit=$share; else cut=1; fi
  if [ "$limit" -lt 5 ]; then
    say "$name: SKIPPED, the deadline leaves ${limit} s"
    record "$name" SKIPPED 0 "the deadline left ${limit} s of its ${share} s"
    return 1
  fi
  say "$name (at most ${limit} s)"
  t0=$SECONDS
  # Through bash, so that COMMAND may be one of the functions below (exported).
  timeout -k 5 "$limit" bash -c '"$@"' "$name" "$@" >"$logs/$name.log" 2>&1
  rc=$?
  # timeout's 124, or 137 after its kill, only once the limit has passed: a 137 before it is a
  # kill from elsewhere (the kernel's OOM killer), a failure.
  local timed_out=0
  if { [ $rc = 124 ] || [ $rc = 137 ]; } && [ $((SECONDS - t0)) -ge "$limit" ]; then timed_out=1; fi
  if [ $rc = 0 ]; then
    record "$name" PASS $((SECONDS - t0)) ""
  elif [ $timed_out = 1 ] && [ $cut = 1 ]; then
    record "$name" SKIPPED $((SECONDS - t0)) "the deadline cut it at ${limit} s of its ${share} s"
  elif [ $timed_out = 1 ]; then
    record "$name" FAIL $((SECONDS - t0)) "stopped by its own cap of ${limit} s, not the deadline"
  elif [ $rc = 77 ]; then  # a prerequisite of the machine, not the code under test
    record "$name" SKIPPED $((SECONDS - t0)) "prerequisite absent: $(tail -n 1 "$logs/$name.log")"
  else
    record "$name" FAIL $((SECONDS - t0)) "exit status $rc"
  fi
  say "$name: $(tail -n 1 "$work/steps.tsv" | cut -f2) in $((SECONDS - t0)) s"
  publish
  return $rc
}

# The binaries: a carried archive (unpacked here), a carry/ folder, or a build tree.
if [ -z "$build" ]; then
  if [ ! -f "$archive" ]; then
    echo "device-check: no archive at $archive (make it with tools/device-build.sh)" >&2
    exit 2
  fi
  say "unpacking $(basename "$archive")"
  if ! tar -C "$work" -xJf "$archive" 2>"$logs/unpack.log"; then
    # An image without xz: Python's own lzma reads it.
    python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" \
      "$archive" "$work" 2>>"$logs/unpack.log" || { cat "$logs/unpack.log" >&2; exit 2; }
  fi
  build=$work/carry
fi
bin_path() {
  local dir
  for dir in "$build/bin" "$build/bench" "$build/tools" "$build/tests" "$build/tests/model"; do
    [ -x "$dir/$1" ] && { echo "$dir/$1"; return 0; }
  done
  return 1
}
# The carried libraries (and cuBLAS) are for the carried binaries alone: the machine's own programs
# (python3, nvidia-smi, cmake, the compiler) keep the machine's own libraries.
carry_libs=""
[ -d "$build/lib" ] && carry_libs=$build/lib
with_libs() { LD_LIBRARY_PATH="$carry_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$@"; }
run_bin() { local b; b=$(bin_path "$1") || return 127; shift; with_libs "$b" "$@"; }

# ---- env: the machine, and cuBLAS --------------------------------------------------------------
cublas_dir=""
if [ "$backend" = cuda ]; then
  torch_nvidia=$(python3 -c "import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)) + '/nvidia')" 2>/dev/null)
  for dir in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
             ${torch_nvidia:+"$torch_nvidia/cu13/lib" "$torch_nvidia/cublas/lib"}; do
    [ -e "$dir/libcublas.so.13" ] && { cublas_dir=$dir; break; }
  done
  [ -n "$cublas_dir" ] && carry_libs="${carry_libs:+$carry_libs:}$cublas_dir"
fi
commit=$(cat "$build/commit" 2>/dev/null || git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)
python3 - "$work/env.json" "$commit" "$backend" "$small" "$deadline" "$cublas_dir" <<'PY'
import datetime, json, os, subprocess, sys
path, commit, backend, small, deadline, cublas = sys.argv[1:7]
def smi(field):
    try:
        r = subprocess.run(["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=20)
        return r.stdout.strip().splitlines()[0].strip() if r.returncode == 0 and r.stdout.strip() else None
    except (OSError, subprocess.TimeoutExpired, IndexError):
        return None
mem = {}
try:
    for line in open("/proc/meminfo"):
        key, value = line.split(":", 1)
        mem[key] = int(value.split()[0]) * 1024
except OSError:
    pass
gib = lambda k: round(mem[k] / 2**30, 2) if k in mem else None
json.dump({
    "commit": commit, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
    "backend": backend, "small": small == "1", "deadline_s": int(deadline),
    "gpu": smi("name"), "driver": smi("driver_version"), "gpu_memory": smi("memory.total"),
    "pcie_gen": smi("pcie.link.gen.current"), "pcie_gen_max": smi("pcie.link.gen.max"),
    "pcie_width": smi("pcie.link.width.current"), "pcie_width_max": smi("pcie.link.width.max"),
    "cpus": os.cpu_count(), "mem_total_gib": gib("MemTotal"),
    "mem_available_gib": gib("MemAvailable"), "committed_gib": gib("Committed_AS"),
    "cublas_dir": cublas or None, "host_memory_stated": os.environ.get("KVO_HOST_MEMORY"),
    "host_memory_defaulted": os.environ.get("KVO_HOST_MEMORY_DEFAULTED") == "1",
}, open(path, "w"), indent=1)
PY
if [ "$backend" = cuda ]; then
  if [ -z "$cublas_dir" ]; then
    msg="no libcublas.so.13 in the CUDA toolkit (/usr/local/cuda/lib64) nor in the nvidia-cublas wheel beside PyTorch (${torch_nvidia:-no PyTorch}/cu13/lib)"
    say "env: $msg"
    record env FAIL 0 "$msg"
  elif ! nvidia-smi >"$logs/env.log" 2>&1; then
    record env FAIL 0 "nvidia-smi finds no GPU"
  else
    record env PASS 0 "cuBLAS from $cublas_dir"
  fi
else
  record env PASS 0 "host backend"
fi

if [ "$small" = 1 ]; then
  contexts=(1024 4096)
  replay_shape=(--layers 8 --kv-heads 2 --head-dim 64)
  decode_shape=small
  max_bytes=4MiB
  min_time=0.02
  # Runs this short (about 20 ms each) are one stall away from a figure 20x off on a shared
  # machine: the decode steps run 3 times and are judged by their median.
  repetitions=3
  attention_max=8192
  preset=tiny
else
  contexts=(32768 131072)
  replay_shape=(--layers 32 --kv-heads 8 --head-dim 128)
  decode_shape=llama3-8b
  max_bytes=1GiB
  min_time=0.2
  repetitions=1
  attention_max=131072
  preset=llama3-8b
fi
ctx_filter="context:($(IFS='|'; echo "${contexts[*]}"))/"
bench() {  # NAME BINARY ARGS...: Google Benchmark's JSON into NAME.json
  local name=$1 bin=$2
  shift 2
  run_bin "$bin" "$@" --benchmark_out="$work/$name.json" --benchmark_out_format=json
}
gtest() {  # BINARY FILTER
  KVO_REQUIRE_CUDA=1 run_bin "$1" --gtest_filter="$2" --gtest_output="json:$work/tests_$1.json"
}
sanitize() {  # TOOL BINARY FILTER; 77 where this GPU is one compute-sanitizer does not serve
  if [ -f "$work/no_sanitizer" ]; then cat "$work/no_sanitizer"; return 77; fi
  local rc
  # The carried libraries reach the test alone (through env, which the sanitizer follows into
  # the test it execs), never compute-sanitizer, one of the machine's own tools.
  compute-sanitizer --tool "$1" --target-processes all --error-exitcode 99 --print-limit 20 \
    env LD_LIBRARY_PATH="$carry_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    "$(bin_path "$2")" --gtest_filter="$3" 2>&1 | tee "$work/sanitizer.out"
  rc=${PIPESTATUS[0]}
  if grep -qi "device not supported" "$work/sanitizer.out"; then
    echo "compute-sanitizer: Device not supported on this GPU" | tee "$work/no_sanitizer"
    return 77
  fi
  return "$rc"
}
generate() { run_bin kvo-generate --backend "$backend" --json --quiet "$@"; }
export build work backend carry_libs
# keep_as NAME COMMAND...: COMMAND's output also in the work folder as NAME.log, where the judge
# reads it, before the step's own publish.
keep_as() {
  local name=$1
  shift
  "$@" 2>&1 | tee "$work/$name.log"
  return "${PIPESTATUS[0]}"
}
export -f bin_path with_libs run_bin bench gtest sanitize generate keep_as

# The drop-in's native module compiles on the CPUs while the GPU steps run (its step below only
# waits for it), under the same deadline.
# Probed before relying on it: the transformers the drop-in is checked with. Without it the
# drop-in's steps are SKIPPED with the reason, not failed: it is the machine's, not the code's.
dropin_absent=""
wheel=""
for f in "$build"/wheel/kvoffload-*.whl; do [ -f "$f" ] && wheel=$f; done
if [ "$backend" = cuda ] && [ -n "$wheel" ]; then
  tf=$(python3 -c "import transformers; print(transformers.__version__)" 2>/dev/null)
  if [ -z "$tf" ]; then
    dropin_absent="no transformers in this machine's Python"
  elif ! python3 -c "import sys; v = tuple(int(x) for x in sys.argv[1].split('.')[:2])
sys.exit(v < (5, 24))" "$tf" 2>/dev/null; then
    dropin_absent="transformers $tf here; the drop-in is checked with 5.24 or later"
  fi
fi

# The time goes first to what has never run: the CUDA tests, then the new paths (the drop-in with
# CUDA graphs, split attention; window layers and GGUF blocks are in the tests), then the long
# figures, then the sanitizers.
if [ "$backend" = cuda ]; then
  step smoke 30 kvo-replay -- run_bin kvo-replay --backend cuda --layers 4 --kv-heads 2 \
    --head-dim 64 --max-seq 256 --prompt 64 --steps 2
  for t in cuda_cache_test model_cuda_test model_cuda_attention_test model_cuda_quant_test \
           model_cuda_blocks_test; do
    step "tests_$t" 120 "$t" -- gtest "$t" 'Cuda*'
  done
fi

# The drop-in on CUDA tensors: the carried wheel installed beside this machine's PyTorch, then its
# CUDA tests.
if [ -n "$dropin_absent" ] && { [ -z "$only" ] || [[ $only == *",dropin,"* ]]; }; then
  say "dropin: SKIPPED, $dropin_absent"
  record dropin SKIPPED 0 "prerequisite absent: $dropin_absent"
elif [ -z "$dropin_absent" ] && [ "$backend" = cuda ] && [ -n "$wheel" ]; then
  step dropin_install 60 -- python3 -m pip install --no-deps --no-index --quiet \
    --disable-pip-version-check --target "$work/py" "$wheel"
  step dropin 90 -- env KVO_REQUIRE_CUDA=1 PYTHONPATH="$work/py:$root/tests/python" \
    PYTHONDONTWRITEBYTECODE=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
    TRANSFORMERS_VERBOSITY=error python3 -m unittest discover -v -s "$root/tests/python" \
    -p test_hf_cuda.py
fi

# Split attention at 128K, every layer streamed: decode with --split off, then --split auto (the
# row from the rates the cache measures when it is made).
if [ "$backend" = cuda ] && [ "$small" = 0 ]; then
  ctx=${contexts[-1]}
  split_runs() {
    local ctx=$1 mode
    for mode in off auto; do
      generate --preset "$2" --prompt-len "$ctx" --max-seq $((ctx + 16)) --max-new 8 \
        --resident 0 --split "$mode" >"$work/split_${mode}_$ctx.log" || return 1
      tail -n 1 "$work/split_${mode}_$ctx.log"
    done
  }
  export -f split_runs
  step split 90 kvo-generate -- split_runs "$ctx" "$preset"
fi

step bandwidth 40 kvo_bench_bandwidth -- bench bandwidth kvo_bench_bandwidth \
  --backend="$backend" --max-bytes="$max_bytes" --benchmark_min_time="$min_time"
if [ "$backend" = cuda ]; then
  step attention 60 kvo_bench_attention -- bench attention kvo_bench_attention \
    --max-context="$attention_max"
  step attention_int8 40 kvo_bench_attention -- bench attention_int8 kvo_bench_attention \
    --kv-dtype=int8 --max-context="$attention_max" --benchmark_filter='Attention'
fi
step decode 60 kvo_bench_decode_compare -- bench decode_compare kvo_bench_decode_compare \
  --backend="$backend" --shape="$decode_shape" --benchmark_filter="$ctx_filter" \
  --benchmark_min_time="$min_time" --benchmark_repetitions="$repetitions"
step decode_int8 40 kvo_bench_decode_compare -- bench decode_compare_int8 \
  kvo_bench_decode_compare --backend="$backend" --shape="$decode_shape" --dtype=int8 \
  --benchmark_filter="kvoffload/$ctx_filter" --benchmark_min_time="$min_time" \
  --benchmark_repetitions="$repetitions"

ctx=${contexts[-1]}
step replay 40 kvo-replay -- keep_as "replay_$ctx" run_bin kvo-replay "${replay_shape[@]}" \
  --max-seq $((ctx + 8)) --prompt "$ctx" --steps 8 --resident 0 --backend "$backend" \
  --verify sample --json

ctx=${contexts[0]}
step generate 60 kvo-generate -- keep_as "generate_$ctx" generate --preset "$preset" \
  --prompt-len "$ctx" --max-seq $((ctx + 32)) --max-new 16 --vram-budget 24GiB
if [ "$backend" = cuda ] && [ "$small" = 0 ]; then
  ctx=${contexts[-1]}
  for kv in bf16 int8; do
    suffix=""
    [ "$kv" = int8 ] && suffix=_int8
    step "prefill$suffix" 75 kvo-generate -- keep_as "generate_prefill_${ctx}${suffix}" \
      generate --preset "$preset" --prompt-len "$ctx" --max-seq $((ctx + 8)) --max-new 4 \
      --chunk 2048 --kv-dtype "$kv" --vram-budget 24GiB
  done
fi

# The sanitizers last of the GPU steps: each pass is slow, and a figure cannot be had later.
if [ "$backend" = cuda ]; then
  if command -v compute-sanitizer >/dev/null; then
    step memcheck_cache 60 cuda_cache_test -- sanitize memcheck cuda_cache_test \
      'CudaCache.EveryAcquireMatchesTheReference:CudaCache.PinnedStoreAndOneDeviceAllocation'
    step memcheck_attention 90 model_cuda_attention_test -- sanitize memcheck \
      model_cuda_attention_test 'CudaAttention.PrefillFromEmptyAndSmallChunks'
    step memcheck_model 90 model_cuda_test -- sanitize memcheck model_cuda_test \
      'CudaSampling.GreedyMatchesTheHostExactly'
    step racecheck_cache 60 cuda_cache_test -- sanitize racecheck cuda_cache_test \
      'CudaCache.ASlowReaderSeesItsOwnLayerWhileTheRingRefills'
    step racecheck_attention 90 model_cuda_attention_test -- sanitize racecheck \
      model_cuda_attention_test 'CudaAttention.PrefillFromEmptyAndSmallChunks'
    step memcheck_tiles 60 model_cuda_quant_test -- sanitize memcheck model_cuda_quant_test \
      'CudaQuant.FlashInferOverTwoBf16TilesAtASmallShape'
    step racecheck_tiles 60 model_cuda_quant_test -- sanitize racecheck model_cuda_quant_test \
      'CudaQuant.FlashInferOverTwoBf16TilesAtASmallShape'
  else
    record memcheck SKIPPED 0 "no compute-sanitizer on this machine"
  fi
fi

elapsed=$((SECONDS - start))
python3 - "$work/env.json" "$elapsed" <<'PY'
import json, sys
env = json.load(open(sys.argv[1]))
env["elapsed_s"] = int(sys.argv[2])
json.dump(env, open(sys.argv[1], "w"), indent=1)
PY
say "judging against $(basename "$bands")"
cp "$work"/*.json "$logs/" 2>/dev/null
python3 "$root/tools/device_judge.py" --work "$work" --bands "$bands" --out "$out" \
  "${judge_args[@]}" >"$logs/judge.log" 2>&1
status=$?
if [ -f "$out/summary.md" ]; then
  cat "$out/summary.md"
else
  cat "$logs/judge.log"
fi
if grep -q "	FAIL	" "$work/steps.tsv"; then
  while IFS=$'\t' read -r name verdict seconds note; do
    [ "$verdict" = FAIL ] || continue
    printf '==== %s (%s)\n' "$name" "$note"
    tail -n 60 "$logs/$name.log" 2>/dev/null
  done <"$work/steps.tsv" >"$out/failed.log"
fi
tar -C "$work" -czf "$out/logs.tar.gz" logs
exit $status
