#!/usr/bin/env bash
# The check to run on a machine with a GPU, sized for a short lease (it finishes within about 8
# minutes on an H200). It runs a build made elsewhere (tools/device-build.sh: sm_90 and PTX,
# carried over) and rebuilds the tools there only if that build does not run. In order:
#   1. the driver and the GPU (nvidia-smi, then a one-second kvo-replay on CUDA);
#   2. the CUDA tests with KVO_REQUIRE_CUDA=1 (a missing GPU fails them instead of skipping);
#   3. the copy bandwidth benchmark;
#   4. the attention kernels alone against HBM bandwidth and the bf16 GEMM rate;
#   5. the decode step at 32K and 128K: all resident, kvoffload streaming every layer, and a
#      cache that moves bytes as transformers' offloaded static cache does;
#   6. kvo-replay at 128K with every layer streamed (bytes checked against the formula);
#   7. kvo-generate --preset llama3-8b at 32K under --vram-budget 24GiB;
#   8. a 128K prefill of the same, only if the figures measured above predict it under 60 s;
#   9. with time left and a Python with torch there: the LibTorch adapter's CUDA tests, built
#      there against that torch.
# Every figure goes into $OUT/device-check.json with the commit, date, GPU and driver, and a
# Markdown table is printed last: each figure beside the paper model of
# bench/results/expected-h200.md.
#
#   tools/device-check.sh [--build DIR] [--out DIR] [--backend cuda|host] [--small] [--no-tests]
#
# --build: a carried folder (bin/, lib/) or a build tree. --small uses small sizes (seconds, any
# backend) and, with --no-tests and --backend host, is how CI keeps this script from rotting.
# Environment: KVO_COMMIT names the commit when neither the tree nor the build knows it.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$root/build-device/carry
out=${OUT:-$root/out}
backend=cuda
small=0
tests=1
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --backend) backend=$2; shift 2 ;;
    --small) small=1; shift ;;
    --no-tests) tests=0; shift ;;
    --help|-h) sed -n '2,26p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "device-check: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
start_s=$SECONDS
status=0
step() { echo "== [$((SECONDS - start_s)) s] $*" >&2; }
fail() { echo "device-check: $*" >&2; status=1; }

# Where a binary is: bin/ of a carried folder, or its place in a build tree.
find_bin() {
  local name=$1 dir
  for dir in "$build/bin" "$build/bench" "$build/tools" "$build/tests" "$build/tests/model" \
             "$build/rebuilt/tools"; do
    [ -x "$dir/$name" ] && { echo "$dir/$name"; return 0; }
  done
  return 1
}
[ -d "$build/lib" ] && export LD_LIBRARY_PATH="$build/lib:${LD_LIBRARY_PATH:-}"
[ -d /usr/local/cuda/lib64 ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}:/usr/local/cuda/lib64"

commit=${KVO_COMMIT:-$(git -C "$root" rev-parse HEAD 2>/dev/null || cat "$build/commit" 2>/dev/null || echo unknown)}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n1)
driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n1)

if [ "$small" = 1 ]; then
  contexts=(1024 4096)
  shape=(--layers 8 --kv-heads 2 --head-dim 64)
  bench_shape=small
  max_bytes=4MiB
  min_time=0.02
  attention_max=8192
else
  contexts=(32768 131072)
  shape=(--layers 32 --kv-heads 8 --head-dim 128)
  bench_shape=llama3-8b
  max_bytes=1GiB
  min_time=0.2
  attention_max=131072
fi

# 1. The driver, and whether the carried build runs here.
step "driver: ${gpu:-no GPU found by nvidia-smi}, driver ${driver:-none}"
if [ "$backend" = cuda ]; then
  [ -n "$gpu" ] || fail "nvidia-smi finds no GPU"
  replay=$(find_bin kvo-replay)
  if [ -z "$replay" ] || ! "$replay" --backend cuda --layers 4 --kv-heads 2 --head-dim 64 \
      --max-seq 256 --prompt 64 --steps 2 >"$out/smoke.log" 2>&1; then
    tail -n 5 "$out/smoke.log" >&2
    if [ -d "$build/flashinfer-include" ] && command -v nvcc >/dev/null; then
      step "the carried build does not run here: rebuilding the tools (tests and benchmarks need GoogleTest and Google Benchmark, which this machine lacks)"
      cmake -S "$root" -B "$build/rebuilt" -DCMAKE_BUILD_TYPE=Release -DKVO_BUILD_TESTS=OFF \
        -DKVO_BUILD_BENCHMARKS=OFF -DCMAKE_CUDA_ARCHITECTURES=native \
        -DKVO_FLASHINFER_INCLUDE_DIR="$build/flashinfer-include" >"$out/rebuild.log" 2>&1 &&
        cmake --build "$build/rebuilt" -j "$(nproc)" --target kvo-replay kvo-generate \
          >>"$out/rebuild.log" 2>&1 || fail "rebuild failed (see rebuild.log)"
    else
      fail "the build in $build does not run here (see smoke.log)"
    fi
  fi
fi

# 2. The CUDA tests: every test of these binaries that needs a GPU, which may not skip.
step "CUDA tests (KVO_REQUIRE_CUDA=1)"
: >"$out/tests.log"
if [ "$tests" = 1 ]; then
  for t in cuda_cache_test model_cuda_test model_cuda_attention_test; do
    bin=$(find_bin "$t") || { fail "test binary $t not found in $build"; continue; }
    KVO_REQUIRE_CUDA=1 timeout 240 "$bin" --gtest_filter='Cuda*' \
      --gtest_output="json:$out/tests_$t.json" >>"$out/tests.log" 2>&1 || fail "$t failed"
  done
  grep -E "^\[  (PASSED|FAILED|SKIPPED) " "$out/tests.log" >&2
else
  echo "skipped (--no-tests)" >"$out/tests.log"
fi

run_bench() {  # name, timeout, binary, args...
  local name=$1 limit=$2 bin
  bin=$(find_bin "$3") || { fail "$3 not found in $build"; return; }
  shift 3
  timeout "$limit" "$bin" "$@" --benchmark_out="$out/$name.json" --benchmark_out_format=json \
    >/dev/null 2>"$out/$name.log" || fail "$name failed (see $name.log)"
}

# 3. Copy bandwidth.
step "copy bandwidth"
run_bench bandwidth 90 kvo_bench_bandwidth --backend="$backend" --max-bytes="$max_bytes" \
  --benchmark_min_time="$min_time"

# 4. Attention kernels alone (GPU only).
if [ "$backend" = cuda ]; then
  step "attention kernels: decode and prefill against HBM and the bf16 GEMM rate"
  run_bench attention 150 kvo_bench_attention --max-context="$attention_max"
fi

# 5. The decode step in three caches.
step "decode step: all-resident, kvoffload (every layer streamed), hf-like"
filter="context:($(IFS='|'; echo "${contexts[*]}"))/"
run_bench decode_compare 150 kvo_bench_decode_compare --backend="$backend" \
  --shape="$bench_shape" --benchmark_filter="$filter" --benchmark_min_time="$min_time"

# 6. kvo-replay at the longest context, every layer streamed.
ctx=${contexts[-1]}
step "kvo-replay at $ctx tokens, every layer streamed"
if bin=$(find_bin kvo-replay); then
  timeout 120 "$bin" "${shape[@]}" --max-seq $((ctx + 8)) --prompt "$ctx" --steps 8 --resident 0 \
    --backend "$backend" --verify sample --json >"$out/replay_$ctx.log" 2>&1 || fail "kvo-replay failed"
  tail -n 1 "$out/replay_$ctx.log" >"$out/replay_$ctx.json"
fi

# 7. and 8. kvo-generate.
generate() {  # name, timeout, args...
  local name=$1 limit=$2 bin
  shift 2
  bin=$(find_bin kvo-generate) || { fail "kvo-generate not found"; return; }
  timeout "$limit" "$bin" --backend "$backend" --json --quiet "$@" >"$out/$name.log" 2>&1 ||
    fail "kvo-generate ($name) failed"
  tail -n 1 "$out/$name.log" >"$out/$name.json"
}
preset=llama3-8b
[ "$small" = 1 ] && preset=tiny
ctx=${contexts[0]}
step "kvo-generate --preset $preset at $ctx tokens, --vram-budget 24GiB"
generate generate_$ctx 120 --preset "$preset" --prompt-len "$ctx" --max-seq $((ctx + 32)) \
  --max-new 16 --vram-budget 24GiB

# The 128K prefill, predicted from this run's own figures: attention at the measured rate of a
# 1024-row chunk after 64K keys (the average prefix), the GEMMs at 0.8 of the measured bf16 rate.
ctx=${contexts[-1]}
predicted=$(python3 - "$out" "$ctx" <<'PY'
import json, sys
out, ctx = sys.argv[1], int(sys.argv[2])
try:
    bench = {b["name"]: b for b in json.load(open(f"{out}/attention.json"))["benchmarks"]}
    gemm = next(b["flop_per_s"] for n, b in bench.items() if n.startswith("BM_GemmBf16"))
    pre = [b for n, b in bench.items() if n.startswith("BM_PrefillAttention")]
    rate = min(pre, key=lambda b: abs(b["prefix"] - ctx / 2))["flop_per_s"]
except (OSError, ValueError, KeyError, StopIteration):
    print(-1); sys.exit()
layers, heads, d, params = 32, 32, 128, 7.0e9
attention = 4 * ctx * ctx / 2 * heads * d * layers
gemms = 2 * params * ctx
print(f"{attention / rate + gemms / (0.8 * gemm) + 5:.1f}")  # + setup
PY
)
if [ "$backend" = cuda ] && [ "$small" = 0 ]; then
  if python3 -c "import sys; p=float(sys.argv[1]); sys.exit(0 if 0 <= p < 60 else 1)" "$predicted"; then
    step "128K prefill (predicted ${predicted} s)"
    generate prefill_$ctx 150 --preset "$preset" --prompt-len "$ctx" --max-seq $((ctx + 8)) \
      --max-new 4 --chunk 2048 --vram-budget 24GiB
  else
    step "128K prefill skipped: predicted ${predicted} s (not under 60 s, or not predicted)"
  fi
fi

# 9. The LibTorch adapter on CUDA, built here against this machine's torch, with time left.
if [ "$backend" = cuda ] && [ "$tests" = 1 ] && [ $((SECONDS - start_s)) -lt 330 ] &&
   python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null &&
   [ -d "$build/flashinfer-include" ]; then
  step "LibTorch adapter: build against this torch and run its CUDA tests"
  tb=$build/torch-build
  if cmake -S "$root" -B "$tb" -DCMAKE_BUILD_TYPE=Release -DKVO_PYTHON="$(command -v python3)" \
       -DCMAKE_CUDA_ARCHITECTURES=native -DKVO_BUILD_BENCHMARKS=OFF \
       -DKVO_FLASHINFER_INCLUDE_DIR="$build/flashinfer-include" >"$out/torch.log" 2>&1 &&
     timeout 200 cmake --build "$tb" -j "$(nproc)" --target torch_cache_test >>"$out/torch.log" 2>&1; then
    KVO_REQUIRE_CUDA=1 timeout 60 "$tb/tests/capi/torch_cache_test" --gtest_filter='*Cuda*' \
      --gtest_output="json:$out/tests_torch_cache_test.json" >>"$out/tests.log" 2>&1 ||
      fail "torch_cache_test failed"
  else
    echo "device-check: the LibTorch build did not finish here (see torch.log); not counted" >&2
  fi
fi

step "summary"
python3 - "$out" "$commit" "$gpu" "$driver" "$backend" "$root/bench/results/expected-h200.md" \
  "$small" "$((SECONDS - start_s))" <<'PY' || status=1
import datetime, glob, json, os, re, sys
out, commit, gpu, driver, backend, expected_md, small, elapsed = sys.argv[1:9]

def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        return {"error": f"{os.path.basename(path)}: {e}"}

def benches(doc):
    return doc.get("benchmarks", []) if isinstance(doc, dict) else []

figures = {
    "commit": commit, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
    "gpu": gpu or None, "driver": driver or None, "backend": backend, "small": small == "1",
    "elapsed_s": int(elapsed),
    "tests": {os.path.basename(p)[6:-5]: load(p) for p in sorted(glob.glob(f"{out}/tests_*.json"))},
    "bandwidth": load(f"{out}/bandwidth.json"),
    "attention": load(f"{out}/attention.json"),
    "decode_compare": load(f"{out}/decode_compare.json"),
    "replay": {os.path.basename(p)[7:-5]: load(p) for p in sorted(glob.glob(f"{out}/replay_*.json"))},
    "generate": {os.path.basename(p)[:-5]: load(p)
                 for p in sorted(glob.glob(f"{out}/generate_*.json") + glob.glob(f"{out}/prefill_*.json"))},
}

# Measured figures under the keys of expected-h200.md.
measured = {}
h2d = [b.get("bytes_per_second", 0) for b in benches(figures["bandwidth"])
       if b["name"].startswith("BM_Copy/H2D/")]
if h2d:
    measured["h2d_GBps"] = max(h2d) / 1e9
for b in benches(figures["attention"]):
    n = b["name"]
    if n.startswith("BM_HbmCopy"):
        measured["hbm_TBps"] = b["hbm_bytes_per_s"] / 1e12
    elif n.startswith("BM_GemmBf16"):
        measured["gemm_TFLOPs"] = b["flop_per_s"] / 1e12
    elif n.startswith("BM_DecodeAttention"):
        measured[f"decode_attn_{int(b['context']) // 1024}k_us"] = b["time_s"] * 1e6
        measured[f"decode_attn_{int(b['context']) // 1024}k_hbm_fraction"] = b.get("hbm_fraction")
    elif n.startswith("BM_PrefillAttention"):
        measured[f"prefill_attn_{int(b['prefix']) // 1024}k_ms"] = b["time_s"] * 1e3
        measured[f"prefill_attn_{int(b['prefix']) // 1024}k_gemm_fraction"] = b.get("gemm_fraction")
for b in benches(figures["decode_compare"]):
    if "error_message" in b or "step_s" not in b:
        continue
    kind, k = b["name"].split("/")[1], int(b["context"]) // 1024
    if kind == "kvoffload":
        measured[f"decode_streamed_{k}k_ms"] = b["step_s"] * 1e3
        measured[f"step_floor_{k}k_ms"] = b["step_s"] * b["efficiency"] * 1e3
        measured[f"decode_streamed_{k}k_efficiency"] = b["efficiency"]
    elif kind == "hf_like":
        measured[f"hf_like_{k}k_ms"] = b["step_s"] * 1e3
for ctx, r in figures["replay"].items():
    if "h2d_bytes_last_step" in r:
        measured[f"replay_{int(ctx) // 1024}k_h2d_GiB"] = r["h2d_bytes_last_step"] / 2**30
        measured[f"replay_{int(ctx) // 1024}k_verified"] = r.get("verified")
for name, g in figures["generate"].items():
    if "prefill_tokens_per_s" not in g:
        continue
    k = int(name.split("_")[1]) // 1024
    if name.startswith("generate"):
        measured[f"generate_{k}k_prefill_tok_s"] = g["prefill_tokens_per_s"]
        measured[f"generate_{k}k_decode_tok_s"] = g["decode_tokens_per_s"]
    else:
        measured[f"prefill_{k}k_s"] = g["prefill_s"]
    measured[f"{name}_attention"] = g.get("attention")
figures["measured"] = measured

expected = {}
try:
    for line in open(expected_md):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and re.fullmatch(r"[A-Za-z0-9_]+", cells[0]) and cells[0] != "key":
            expected[cells[0]] = (cells[1], float(cells[2]), cells[3])
except OSError:
    pass
figures["expected"] = {k: {"figure": f, "value": v, "unit": u} for k, (f, v, u) in expected.items()}
tests = {name: {"tests": t.get("tests"), "failures": t.get("failures"), "errors": t.get("errors")}
         for name, t in figures["tests"].items() if isinstance(t, dict)}
figures["tests_summary"] = tests
with open(f"{out}/device-check.json", "w") as f:
    json.dump(figures, f, indent=1)

print(f"\n| figure | measured | expected (paper) | ratio |\n| --- | ---: | ---: | ---: |")
print(f"| commit | {commit[:12]} | | |")
print(f"| GPU | {gpu or 'none'} (driver {driver or 'none'}, {backend} backend) | | |")
for name, t in tests.items():
    print(f"| tests {name} | {t['tests']} run, {t['failures']} failed | all pass | |")
for key, (figure, value, unit) in expected.items():
    m = measured.get(key)
    shown = "not measured" if m is None else f"{m:.4g} {unit}"
    ratio = "" if m is None or value == 0 else f"{m / value:.2f}"
    print(f"| {figure} | {shown} | {value:g} {unit} | {ratio} |")
for key in sorted(measured):
    if key.endswith(("fraction", "efficiency", "verified", "attention")) and measured[key] is not None:
        v = measured[key]
        shown = v if isinstance(v, (str, bool)) else f"{v:.3f}"
        print(f"| {key} | {shown} | | |")
print(f"| elapsed | {elapsed} s | at most 480 s | |")
PY
exit $status
