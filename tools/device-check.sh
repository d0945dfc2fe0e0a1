#!/usr/bin/env bash
# The check to run on a machine with a GPU, from a build made elsewhere or here. Sized to finish
# well inside 10 minutes on one GPU: CUDA tests, the benchmarks, and kvo-replay (and
# kvo-generate, when built) at 32K and 128K tokens of the Llama-3-8B shape. Writes every figure
# into one JSON file (commit, date, GPU, driver) and prints a short Markdown table last.
#
#   tools/device-check.sh [--build DIR] [--out DIR] [--backend cuda|host] [--small] [--no-tests]
#
# --small uses small sizes (seconds, any backend) and, with --no-tests, is how CI keeps this
# script from rotting.
# Environment: KVO_COMMIT names the commit when the tree has no .git.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$root/build
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
    *) echo "device-check: unknown option $1" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
commit=${KVO_COMMIT:-$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n1)
driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n1)
status=0
step() { echo "== $*" >&2; }

if [ "$small" = 1 ]; then
  contexts=(1024 4096)
  shape=(--layers 8 --kv-heads 2 --head-dim 64)
  bench_shape=small
  max_bytes=4MiB
  min_time=0.02
else
  contexts=(32768 131072)
  shape=(--layers 32 --kv-heads 8 --head-dim 128)
  bench_shape=llama3-8b
  max_bytes=1GiB
  min_time=0.2
fi

step "tests"
if [ "$tests" = 0 ]; then
  echo "skipped (--no-tests)" >"$out/ctest.log"
elif [ "$backend" = cuda ]; then
  ctest --test-dir "$build" -L unit --output-on-failure >"$out/ctest.log" 2>&1 || status=1
else
  ctest --test-dir "$build" -L unit -E Cuda --output-on-failure >"$out/ctest.log" 2>&1 || status=1
fi
tail -n 3 "$out/ctest.log" >&2

step "copy bandwidth"
"$build/bench/kvo_bench_bandwidth" --backend="$backend" --max-bytes="$max_bytes" \
  --benchmark_min_time="$min_time" --benchmark_format=json --benchmark_out="$out/bandwidth.json" \
  --benchmark_out_format=json >/dev/null 2>"$out/bandwidth.log" || status=1

step "decode step: all-resident, kvoffload, hf-like"
"$build/bench/kvo_bench_decode_compare" --backend="$backend" --shape="$bench_shape" \
  --benchmark_min_time="$min_time" --benchmark_out="$out/decode_compare.json" \
  --benchmark_out_format=json >/dev/null 2>"$out/decode_compare.log" || status=1

for ctx in "${contexts[@]}"; do
  step "kvo-replay at $ctx tokens"
  "$build/tools/kvo-replay" "${shape[@]}" --max-seq $((ctx + 8)) --prompt "$ctx" --steps 8 \
    --backend "$backend" --verify sample --json >"$out/replay_$ctx.log" 2>&1 || status=1
  tail -n 1 "$out/replay_$ctx.log" >"$out/replay_$ctx.json"
  if [ -x "$build/tools/kvo-generate" ]; then
    step "kvo-generate at $ctx tokens"
    preset=llama3-8b
    [ "$small" = 1 ] && preset=tiny
    "$build/tools/kvo-generate" --preset "$preset" --prompt-len "$ctx" --max-seq $((ctx + 32)) \
      --max-new 16 --vram-budget 24GiB --backend "$backend" --json >"$out/generate_$ctx.log" \
      2>&1 || status=1
    tail -n 1 "$out/generate_$ctx.log" >"$out/generate_$ctx.json"
  fi
done

step "summary"
python3 - "$out" "$commit" "$gpu" "$driver" "$backend" <<'PY' || status=1
import glob, json, os, sys, datetime
out, commit, gpu, driver, backend = sys.argv[1:6]
def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        return {"error": f"{os.path.basename(path)}: {e}"}
figures = {
    "commit": commit, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
    "gpu": gpu or None, "driver": driver or None, "backend": backend,
    "bandwidth": load(f"{out}/bandwidth.json"),
    "decode_compare": load(f"{out}/decode_compare.json"),
    "replay": {os.path.basename(p)[7:-5]: load(p) for p in sorted(glob.glob(f"{out}/replay_*.json"))},
    "generate": {os.path.basename(p)[9:-5]: load(p) for p in sorted(glob.glob(f"{out}/generate_*.json"))},
}
with open(f"{out}/device-check.json", "w") as f:
    json.dump(figures, f, indent=1)
print(f"\n| figure | value |\n| --- | --- |")
print(f"| commit | {commit[:12]} |\n| GPU | {gpu or 'none'} ({backend} backend) |")
peak = {}
for b in figures["bandwidth"].get("benchmarks", []):
    d = b["name"].split("/")[1]
    peak[d] = max(peak.get(d, 0), b.get("bytes_per_second", 0))
for d, v in peak.items():
    print(f"| peak {d} copy | {v / 1e9:.2f} GB/s |")
for b in figures["decode_compare"].get("benchmarks", []):
    if "error_message" in b or "efficiency" not in b:
        continue
    kind = b["name"].split("/")[1]
    print(f"| decode {kind} @ {int(b['context'])} | {b['step_s'] * 1e3:.2f} ms/step, "
          f"efficiency {b['efficiency']:.3f} |")
for ctx, r in figures["replay"].items():
    if "verified" in r:
        print(f"| kvo-replay @ {ctx} | verified={r['verified']}, "
              f"H2D {r['h2d_bytes_last_step'] / 2**20:.1f} MiB/step, "
              f"acquire wait {r['acquire_wait_s']:.4f} s |")
    else:
        print(f"| kvo-replay @ {ctx} | failed |")
for ctx, g in figures["generate"].items():
    if "decode_tokens_per_s" in g:
        print(f"| kvo-generate @ {ctx} | prefill {g['prefill_tokens_per_s']:.0f} tok/s, "
              f"decode {g['decode_tokens_per_s']:.2f} tok/s |")
    else:
        print(f"| kvo-generate @ {ctx} | failed |")
PY
exit $status
