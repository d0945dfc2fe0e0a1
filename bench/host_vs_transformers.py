#!/usr/bin/env python3
"""kvo-generate on the host backend against transformers on the CPU: same weights, same prompt,
same thread count, greedy. Prints one JSON object (and writes it with --json).

For each model and each prompt length it runs, in this order:
  - transformers (float32, CPU, its default dynamic cache, sdpa attention): one untimed warm-up
    generate of 2 tokens, then one timed generate of --max-new tokens. A streamer stamps when
    generate hands over the prompt and then each new token, so prefill = prompt put -> first
    token (the prompt's forward and the first greedy choice) and decode = first token -> last
    token, i.e. max_new - 1 steps;
  - kvo-generate --backend host --resident all (everything in memory, as transformers has it),
    whose --json line reports the same two quantities (prefill_tokens_per_s, and
    decode_tokens_per_s over max_new - 1 steps).
torch.set_num_threads(--threads) on one side, --threads on the other. With --kernels, kvo-generate
runs once per OpenBLAS kernel set named (KVO_BLAS_CORETYPE; "chosen" is the host path's own
choice for the CPU), and with --repeats N every run is made N times, alternating, and the
medians are reported (with the spread).

Models: --make-model writes a random model with kvo-make-model (--preset, in float32); --model
names a Hugging Face directory (the real SmolLM2-135M-Instruct that tools/smollm2.sh makes). Both
may be given. A model with a tokenizer gets real English text as its prompt (the GPL-3 text Debian
ships), others seeded random ids.

    host_vs_transformers.py --kvo-generate build/tools/kvo-generate \\
        --make-model build/tools/kvo-make-model --model "$(tools/smollm2.sh)" \\
        --prompt-lens 512,2048 --max-new 64 --threads 2 --json out.json

Exit status 0 when every pair generated identical tokens (or --allow-mismatch), 1 otherwise.
"""
import argparse
import datetime
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time

TEXT = "/usr/share/common-licenses/GPL-3"


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kvo-generate", required=True)
    p.add_argument("--make-model", help="kvo-make-model binary: also run a random model it writes")
    p.add_argument("--preset", default="tiny", help="kvo-make-model preset")
    p.add_argument("--model", action="append", default=[], help="Hugging Face model directory")
    p.add_argument("--prompt-lens", default="512,2048")
    p.add_argument("--max-new", type=int, default=64)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", help="also write the result here")
    p.add_argument("--allow-mismatch", action="store_true")
    p.add_argument("--kernels", default="chosen",
                   help="comma-separated: chosen, or OpenBLAS core names (Prescott, Haswell, ...)")
    p.add_argument("--repeats", type=int, default=1)
    return p.parse_args(argv)


def machine():
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "system": platform.platform()}


def commit():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        return subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def prompt_for(model_dir, length, vocab, seed):
    if os.path.exists(os.path.join(model_dir, "tokenizer.json")):
        from transformers import AutoTokenizer
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        with open(TEXT, encoding="utf-8") as f:
            ids = tokenizer(f.read())["input_ids"]
        if len(ids) < length:
            raise RuntimeError(f"{TEXT} has {len(ids)} tokens, fewer than {length}")
        return ids[:length], "text"
    rng = random.Random(seed)
    return [rng.randrange(vocab) for _ in range(length)], "random ids"


def run_transformers(torch, model, prompt, max_new):
    from transformers import GenerationConfig
    from transformers.generation.streamers import BaseStreamer

    class Stamps(BaseStreamer):
        def __init__(self):
            self.times, self.tokens = [], []

        def put(self, value):
            self.times.append(time.perf_counter())
            if len(self.times) > 1:
                self.tokens.extend(int(t) for t in value.reshape(-1).tolist())

        def end(self):
            pass

    ids = torch.tensor([prompt])

    def generate(new):
        config = GenerationConfig(do_sample=False, max_new_tokens=new, min_new_tokens=new,
                                  eos_token_id=None, bos_token_id=None, pad_token_id=0)
        stamps = Stamps()
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                 generation_config=config, streamer=stamps)
        tokens = out[0, ids.shape[1]:].tolist()
        if len(tokens) != new or len(stamps.times) != new + 1:
            raise RuntimeError(f"transformers generated {len(tokens)} tokens, not {new}")
        return stamps.times, tokens

    generate(2)
    times, tokens = generate(max_new)
    prefill_s, decode_s = times[1] - times[0], times[-1] - times[1]
    return {"tokens": tokens, "prefill_s": prefill_s, "decode_s": decode_s,
            "prefill_tokens_per_s": len(prompt) / prefill_s,
            "decode_tokens_per_s": (max_new - 1) / decode_s if max_new > 1 else None}


def run_kvo(args, model_dir, prompt_file, kernels="chosen"):
    cmd = [args.kvo_generate, "--model", model_dir, "--prompt-tokens", prompt_file,
           "--max-new", str(args.max_new), "--backend", "host", "--resident", "all",
           "--threads", str(args.threads), "--json", "--quiet"]
    env = dict(os.environ)
    env.pop("KVO_BLAS_CORETYPE", None)
    if kernels != "chosen":
        env["KVO_BLAS_CORETYPE"] = kernels
    run = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if run.returncode != 0:
        raise RuntimeError(f"kvo-generate failed:\n{run.stdout}{run.stderr}")
    result = json.loads(run.stdout.strip().splitlines()[-1])
    return {"tokens": result["tokens"][0], "prefill_s": result["prefill_s"],
            "decode_s": result["decode_s"],
            "prefill_tokens_per_s": result["prefill_tokens_per_s"],
            "decode_tokens_per_s": result["decode_tokens_per_s"], "gemm": result.get("gemm"),
            "command": cmd, "KVO_BLAS_CORETYPE": env.get("KVO_BLAS_CORETYPE")}


def median_of(results):
    """The run with the median prefill rate, with every run's prefill and decode rates."""
    ranked = sorted(results, key=lambda r: r["prefill_tokens_per_s"])
    out = dict(ranked[len(ranked) // 2])
    out["prefill_tokens_per_s_all"] = [r["prefill_tokens_per_s"] for r in results]
    out["decode_tokens_per_s_all"] = [r["decode_tokens_per_s"] for r in results]
    decodes = sorted(r["decode_tokens_per_s"] for r in results if r["decode_tokens_per_s"])
    if decodes:
        out["decode_tokens_per_s"] = decodes[len(decodes) // 2]
    return out


def main(argv=None):
    args = parse_args(argv)
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    lengths = [int(x) for x in args.prompt_lens.split(",")]
    work = tempfile.mkdtemp(prefix="kvo-vs-hf-")
    models = []
    if args.make_model:
        out = os.path.join(work, args.preset)
        subprocess.run([args.make_model, "--preset", args.preset, "--dtype", "f32", "--out", out,
                        "--seed", str(args.seed)], check=True, capture_output=True)
        models.append((f"kvo-make-model --preset {args.preset}", out))
    models += [(os.path.basename(os.path.normpath(m)), m) for m in args.model]
    if not models:
        sys.exit("host_vs_transformers: give --make-model and/or --model")

    runs = []
    for name, model_dir in models:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        model.eval()
        for length in lengths:
            prompt, kind = prompt_for(model_dir, length, model.config.vocab_size, args.seed)
            prompt_file = os.path.join(work, "prompt.txt")
            with open(prompt_file, "w") as f:
                f.write(" ".join(map(str, prompt)) + "\n")
            kernel_sets = args.kernels.split(",")
            hf_runs, kvo_runs = [], {k: [] for k in kernel_sets}
            for _ in range(args.repeats):  # alternating, so that drift hits every side alike
                hf_runs.append(run_transformers(torch, model, prompt, args.max_new))
                for k in kernel_sets:
                    kvo_runs[k].append(run_kvo(args, model_dir, prompt_file, k))
            hf = median_of(hf_runs)
            by_kernels = {k: median_of(v) for k, v in kvo_runs.items()}
            kvo = by_kernels[kernel_sets[0]]
            same = hf["tokens"] == kvo["tokens"]
            agree = next((i for i, (a, b) in enumerate(zip(hf["tokens"], kvo["tokens"]))
                          if a != b), len(hf["tokens"]))
            row = {
                "model": name, "prompt_tokens": length, "prompt": kind, "new_tokens": args.max_new,
                "transformers": hf, "kvo_generate": kvo,
                "prefill_ratio": kvo["prefill_tokens_per_s"] / hf["prefill_tokens_per_s"],
                "decode_ratio": (kvo["decode_tokens_per_s"] / hf["decode_tokens_per_s"]
                                 if hf["decode_tokens_per_s"] else None),
                "identical_tokens": same, "leading_tokens_agreeing": agree,
                "kvo_generate_by_kernels": by_kernels,
                "prefill_ratio_by_kernels": {
                    k: v["prefill_tokens_per_s"] / hf["prefill_tokens_per_s"]
                    for k, v in by_kernels.items()},
            }
            runs.append(row)
            for k, v in by_kernels.items():
                print(f"  {k:10s} {v['gemm']}: prefill {v['prefill_tokens_per_s']:8.1f} tok/s "
                      f"(x{row['prefill_ratio_by_kernels'][k]:.2f} of transformers)",
                      file=sys.stderr, flush=True)
            print(f"{name:40s} prompt {length:5d}: prefill {hf['prefill_tokens_per_s']:8.1f} vs "
                  f"{kvo['prefill_tokens_per_s']:8.1f} tok/s (x{row['prefill_ratio']:.2f}), decode "
                  f"{hf['decode_tokens_per_s']:7.2f} vs {kvo['decode_tokens_per_s']:7.2f} tok/s "
                  f"(x{row['decode_ratio']:.2f}), identical tokens: {'yes' if same else 'no'}",
                  file=sys.stderr, flush=True)
        del model

    record = {
        "benchmark": "host_vs_transformers", "commit": commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(), "threads": args.threads, "torch": torch.__version__,
        "transformers": transformers.__version__,
        "transformers_setup": "float32, CPU, default (dynamic) cache, sdpa",
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        # The host path chooses OpenBLAS's kernels itself (KVO_BLAS_CORETYPE overrides); the
        # environment's OPENBLAS_CORETYPE still steers torch if it uses OpenBLAS. Each
        # kvo_generate row's "gemm" says which kernels ran.
        "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE"),
        "repeats": args.repeats,
        "kvo_setup": "--backend host --resident all", "runs": runs,
    }
    text = json.dumps(record, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    ok = all(r["identical_tokens"] for r in runs)
    return 0 if ok or args.allow_mismatch else 1


if __name__ == "__main__":
    sys.exit(main())
