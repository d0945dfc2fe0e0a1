#!/usr/bin/env python3
"""What kvoffload.hf.OffloadedStaticCache costs under transformers' generate, against transformers'
own StaticCache on the same model, measured side by side in one run. Prints one JSON object.

Variants (each a fresh cache of --max-cache-len tokens, greedy, --new tokens after a --prompt
token prompt):
  - static:   transformers' StaticCache (every layer on the device);
  - resident: OffloadedStaticCache with every layer resident (no copies at all);
  - streamed: OffloadedStaticCache with every layer streamed through a ring of 2 buffers.
The variants run interleaved, one of each per round, --repeats rounds; each tokens/s is the
median over the rounds, and each ratio the median of the ratios within a round (paired), so that
the drifting load of a shared machine hits both sides of a ratio alike.

Decode tokens/s: a streamer stamps each token as generate puts it; decode = (new - 1) tokens over
the time from the first generated token to the last (the prefill is not in it).

Update time per decode step: the time spent in the cache's update calls (all layers) during the
decode steps, and for the kvoffload variants its split: `native` is the time inside the native
update (kvoffload/_native.py over the C ABI: the checks, the per-step protocol, the appends, and
streamed, waiting for a layer's prefix copy), `python` the rest of the update call (dispatch and
bookkeeping in kvoffload/hf.py), `acquire_wait` the part of `native` spent waiting for prefix
copies (the host backend copies on its own threads, behind the model's compute). Timing adds a
little to every variant alike.

Update alone (`update_only`): the same caches driven without the model, one decode step at a
time after a --prompt token prefill of random keys and values, --steps steps: `cache_update_us`
per layer through OffloadedStaticCache.update (what transformers calls), `native_update_us` per
layer through the native update directly; their difference is the drop-in's own Python per
layer. Streamed, `acquire_wait_us` is the part of the native time spent waiting for a layer's
prefix copy (with no model compute to hide it behind), per layer.

With --compile, the same three variants also run through generate's own compile path
(CompileConfig(backend="inductor", fullgraph=True), on the CPU with _compile_all_devices), after
one untimed warm-up generate each that compiles, in the same rounds as the uncompiled ones; the
JSON then has their tokens/s, their ratio to compiled StaticCache and their speedup over the
same variant uncompiled.

usage:
  hf_overhead.py --model $(tools/smollm2.sh) --prompt 2048 --new 32 --threads 1
  hf_overhead.py --model DIR --prompt 256 --new 64 --compile --json out.json
Needs PYTHONPATH=<build>/python (the kvoffload package) and KVO_PYTHON's torch/transformers.
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import torch
import transformers
from transformers import AutoModelForCausalLM, CompileConfig, StaticCache

from kvoffload.hf import OffloadedStaticCache

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Stamps:
    """A generate streamer that records when each token was put."""

    def __init__(self):
        self.times = []

    def put(self, value):
        self.times.append(time.perf_counter())

    def end(self):
        pass


class UpdateClock:
    """Wraps a cache's update (and, for kvoffload, its native update) with perf counters; keeps
    the time of the calls made after the prefill."""

    def __init__(self, cache):
        self.total = self.native = 0.0
        self.calls = 0
        self.prefill_done = False
        outer = cache.update

        def timed_update(*args, **kwargs):
            start = time.perf_counter()
            result = outer(*args, **kwargs)
            if self.prefill_done:
                self.total += time.perf_counter() - start
                self.calls += 1
            return result

        cache.update = timed_update
        native = getattr(cache, "_native", None)
        if native is not None:
            cache._native = _TimedNative(native, self)


class _TimedNative:
    def __init__(self, native, clock):
        self._inner, self._clock = native, clock

    def update(self, *args):
        start = time.perf_counter()
        result = self._inner.update(*args)
        if self._clock.prefill_done:
            self._clock.native += time.perf_counter() - start
        return result

    def __getattr__(self, name):
        return getattr(self._inner, name)


def make_cache(variant, model, args):
    if variant == "static":
        return StaticCache(config=model.config, max_cache_len=args.max_cache_len)
    layers = model.config.num_hidden_layers
    static_shapes = {"default": None, "on": True, "off": False}[args.static_shapes]
    return OffloadedStaticCache(
        model.config, 1, args.max_cache_len, device="cpu", dtype=model.dtype,
        resident_layers=layers if variant == "resident" else 0, static_shapes=static_shapes,
    )


def run_once(model, ids, variant, args, compile_config=None, clock=False):
    cache = make_cache(variant, model, args)
    timer = UpdateClock(cache) if clock else None
    stamps = Stamps()

    waits = []

    class PrefillMark(Stamps):
        def put(self, value):
            stamps.put(value)
            if timer is not None and len(stamps.times) == 2:  # the prompt, then the first token
                timer.prefill_done = True
                if variant != "static":
                    waits.append(cache.stats()["acquire_wait_s"])

    kwargs = {"compile_config": compile_config} if compile_config is not None else {}
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=args.new, do_sample=False, cache=cache,
                             streamer=PrefillMark(), **kwargs)
    decode_s = stamps.times[-1] - stamps.times[1]
    steps = args.new - 1
    result = {"decode_tokens_per_s": steps / decode_s, "tokens": out[0, ids.shape[1]:].tolist()}
    if timer is not None:
        result["update_ms_per_step"] = 1e3 * timer.total / steps
        if variant != "static":
            result["native_ms_per_step"] = 1e3 * timer.native / steps
            result["python_ms_per_step"] = 1e3 * (timer.total - timer.native) / steps
            waited = cache.stats()["acquire_wait_s"] - waits[0]
            result["acquire_wait_ms_per_step"] = 1e3 * waited / steps
    return result


def measure(model, ids, args, compile_config=None):
    """Every variant once per round, --repeats rounds, with compile_config also every variant
    compiled in the same rounds. Ratios are taken within a round (paired), then their median: the
    load of a shared machine drifts slowly, and a pair sees the same load."""
    variants = [(v, False) for v in ("static", "resident", "streamed")]
    if compile_config is not None:
        variants += [(v, True) for v in ("static", "resident", "streamed")]
    runs = {key: [] for key in variants}
    for _ in range(args.repeats):
        for variant, compiled in variants:
            runs[(variant, compiled)].append(run_once(
                model, ids, variant, args, compile_config if compiled else None,
                clock=not compiled))

    def rate(variant, compiled, round_):
        return runs[(variant, compiled)][round_]["decode_tokens_per_s"]

    def paired(numerator, denominator):
        return statistics.median(rate(*numerator, r) / rate(*denominator, r)
                                 for r in range(args.repeats))

    reference = runs[("static", False)][0]["tokens"]
    summary = {"uncompiled": {}, "compiled": {}}
    for (variant, compiled), results in runs.items():
        entry = {"decode_tokens_per_s": statistics.median(r["decode_tokens_per_s"] for r in results),
                 "decode_tokens_per_s_runs": [round(r["decode_tokens_per_s"], 2) for r in results]}
        for key in ("update_ms_per_step", "native_ms_per_step", "python_ms_per_step",
                    "acquire_wait_ms_per_step"):
            if key in results[0]:
                entry[key] = statistics.median(r[key] for r in results)
        entry["same_tokens_as_static"] = all(r["tokens"] == reference for r in results)
        if variant != "static":
            entry["ratio_to_static"] = paired((variant, compiled), ("static", compiled))
        if compiled:
            entry["speedup_over_uncompiled"] = paired((variant, True), (variant, False))
        summary["compiled" if compiled else "uncompiled"][variant] = entry
    return summary


def update_only(model, args):
    """Per-layer cost of the update with no model around it (see the module docstring)."""
    config = model.config
    layers, kv_heads = config.num_hidden_layers, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    generator = torch.Generator().manual_seed(1)
    prompt = torch.randn(1, kv_heads, args.prompt, head_dim, generator=generator)
    step = torch.randn(1, kv_heads, 1, head_dim, generator=generator)
    sized = argparse.Namespace(**{**vars(args), "max_cache_len": args.prompt + args.steps})
    report = {}
    for variant in ("resident", "streamed"):
        entry = {}
        for path in ("cache", "native"):
            cache = make_cache(variant, model, sized)
            for layer in range(layers):
                cache.update(prompt, prompt, layer)
            if path == "cache":
                update = cache.update
            else:
                native = cache._native

                def update(k, v, layer):
                    return native.update(k, v, layer)
            wait_before = cache.stats()["acquire_wait_s"]
            start = time.perf_counter()
            for _ in range(args.steps):
                for layer in range(layers):
                    update(step, step, layer)
            elapsed = time.perf_counter() - start
            calls = args.steps * layers
            entry[f"{path}_update_us"] = 1e6 * elapsed / calls
            if path == "native":
                waited = cache.stats()["acquire_wait_s"] - wait_before
                entry["acquire_wait_us"] = 1e6 * waited / calls
        entry["python_us"] = entry["cache_update_us"] - entry["native_update_us"]
        entry["per_step_ms"] = entry["cache_update_us"] * layers / 1e3
        report[variant] = entry
    return report


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a Hugging Face model directory")
    parser.add_argument("--prompt", type=int, default=256, help="prompt tokens (random ids)")
    parser.add_argument("--new", type=int, default=32, help="tokens to generate")
    parser.add_argument("--max-cache-len", type=int, default=None,
                        help="cache length (default: prompt + new)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=50, help="decode steps of update_only")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's)")
    parser.add_argument("--static-shapes", choices=("default", "on", "off"), default="default",
                        help="the kvoffload caches' static_shapes (default: the cache's default)")
    parser.add_argument("--compile", action="store_true",
                        help="also run through generate's compile path (inductor)")
    parser.add_argument("--json", help="also write the JSON here")
    args = parser.parse_args()
    if args.max_cache_len is None:
        args.max_cache_len = args.prompt + args.new
    if args.threads:
        torch.set_num_threads(args.threads)

    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None  # always --new tokens
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, model.config.vocab_size, (1, args.prompt), generator=generator)
    run_once(model, ids, "static", args)  # warm-up: first-call costs out of the figures

    commit = subprocess.run(["git", "-C", REPO_ROOT, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    report = {
        "bench": "hf_overhead",
        "commit": commit,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "threads": torch.get_num_threads(),
        "model": os.path.basename(os.path.normpath(args.model)),
        "layers": model.config.num_hidden_layers,
        "prompt": args.prompt,
        "new": args.new,
        "max_cache_len": args.max_cache_len,
        "repeats": args.repeats,
        "static_shapes": args.static_shapes,
        "update_only": update_only(model, args),
    }
    config = None
    if args.compile:
        config = CompileConfig(backend="inductor", fullgraph=True, mode="default")
        config._compile_all_devices = True
        for variant in ("static", "resident", "streamed"):  # compiles, untimed
            run_once(model, ids, variant, args, config)
    measured = measure(model, ids, args, config)
    report["uncompiled"] = measured["uncompiled"]
    if args.compile:
        report["compiled"] = measured["compiled"]
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as out:
            out.write(text + "\n")


if __name__ == "__main__":
    sys.exit(main())
