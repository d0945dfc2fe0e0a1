#!/usr/bin/env python3
"""Compare kvo-generate with transformers' offloaded static cache on the same weights and prompt.

What it does, in order:
  1. builds a Llama model of the given shape in transformers, with random weights drawn from
     --seed (scaled so that every layer visibly moves the logits), and saves it with
     save_pretrained (config.json + model.safetensors) into --out;
  2. draws a prompt of --context token ids from --seed and writes it to OUT/prompt.txt in the
     form kvo-generate --prompt-tokens reads (ids separated by spaces, one line);
  3. runs greedy generation in transformers with a static cache of --max-cache-len tokens:
     transformers' offloaded static cache (StaticCache(offloading=True), the cache behind
     cache_implementation="offloaded_static") on CUDA, a plain StaticCache on the CPU, since the
     offloading needs CUDA streams;
  4. frees the GPU and runs kvo-generate on OUT with the same prompt, --max-new and
     --max-seq = --max-cache-len, and reads the JSON line it prints last;
  5. prints both side by side as a Markdown table and how many leading generated tokens agree.

How the transformers side is timed: after --warmup untimed generate calls, one generate of
--max-new tokens on a fresh cache (best of --repeat, by decode time) with a streamer that stamps
the time of each put. transformers puts the prompt before the prefill and then each new token as
soon as it is on the host (tokens.cpu(), so the device has finished that step), which gives:
  - prefill: from the prompt's put to the first token's; the prompt's forward pass and the first
    greedy choice, which is what kvo-generate counts as its prefill;
  - decode: from the first token's put to the last one's; max_new - 1 decode steps (forward,
    argmax, cache update), so decode tokens/s = (max_new - 1) / that time. kvo-generate reports
    the same quantity (decode_tokens = max_new - 1 per slot; its decode clock also covers the
    sampling). Neither side's setup (cache allocation, weights) is in either figure.
Peak VRAM is torch.cuda.max_memory_allocated() over the timed generate, weights included (the
counter is reset just before it); None on the CPU. kvo-generate's peak_device_bytes is the growth
of the device's used memory (cudaMemGetInfo) over its run, weights included, on CUDA, and its
planned arena on the host backend (shown as "planned device bytes").
transformers' generate would torch.compile the forward on CUDA with a static cache; that is off
unless --compile is given (compiling an 8B-shaped model takes minutes), and the JSON records it.

The end-of-sequence token is switched off on the transformers side (kvo-generate always
generates --max-new tokens), so both produce exactly --max-new ids. In float32 the two agree
on every token at the small shape; in bfloat16 they round differently and drift apart after a
few tokens (6 of 16 agree in a CPU run at the small shape), so a bfloat16 run should lower
--require-agree, or check agreement with --dtype float32.

Exit status: 0 when at least min(--require-agree, --max-new) leading generated tokens agree,
1 when they do not, 2 on a usage or run error.

usage (CPU check, as in CI):
  hf_compare.py --device cpu --context 200 --max-cache-len 512 --max-new 16
usage (GPU):
  hf_compare.py --shape llama3-8b-like --layers 16 --device cuda --context 32768 \
      --max-cache-len 33024 --max-new 64 --require-agree 1 --json out.json \
      --kvo-args "--vram-budget 24GiB"
"""
import argparse
import gc
import json
import os
import shlex
import subprocess
import sys
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Shapes: a small Llama-3-like one (GQA 4:1, llama3 rope scaling, untied embeddings) that runs in
# seconds on a CPU, and the Llama 3 8B shape (use --layers 16 or so to fit a GPU run's time).
SHAPES = {
    "small": dict(layers=4, hidden=256, intermediate=704, heads=8, kv_heads=2, vocab=2048),
    "llama3-8b-like": dict(layers=32, hidden=4096, intermediate=14336, heads=32, kv_heads=8,
                           vocab=128256),
}


def parse_args(argv):
    p = argparse.ArgumentParser(
        description="transformers' offloaded static cache vs kvo-generate, same weights and prompt",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--shape", choices=sorted(SHAPES), default="small",
                   help="base shape; the flags below override single fields of it")
    p.add_argument("--layers", type=int)
    p.add_argument("--hidden", type=int)
    p.add_argument("--intermediate", type=int)
    p.add_argument("--heads", type=int)
    p.add_argument("--kv-heads", type=int)
    p.add_argument("--vocab", type=int)
    p.add_argument("--context", type=int, default=200, help="prompt tokens")
    p.add_argument("--max-cache-len", type=int, default=512,
                   help="static cache length on both sides (kvo-generate --max-seq)")
    p.add_argument("--max-new", type=int, default=16, help="tokens to generate")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"],
                   help="weights and cache (default: float32 on the CPU, bfloat16 on CUDA)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--attn", default="sdpa", help="transformers attn_implementation")
    p.add_argument("--kvo-generate", default=os.path.join(REPO_ROOT, "build", "tools", "kvo-generate"),
                   help="path of the kvo-generate binary")
    p.add_argument("--kvo-args", default="",
                   help="extra kvo-generate options, one shell-quoted string "
                        "(e.g. \"--vram-budget 24GiB --ring 3\")")
    p.add_argument("--out", default=os.path.join(REPO_ROOT, "build", "hf_compare"),
                   help="directory the model and prompt are written to")
    p.add_argument("--json", help="write every figure to this file")
    p.add_argument("--seed", type=int, default=1, help="weights and prompt")
    p.add_argument("--warmup", type=int, default=1, help="untimed generate calls first")
    p.add_argument("--repeat", type=int, default=1, help="timed generate runs (the fastest decode is kept)")
    p.add_argument("--compile", action="store_true",
                   help="let transformers torch.compile the forward (CUDA only; off by default)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--require-agree", type=int, default=8,
                   help="leading generated tokens that must agree (capped at --max-new)")
    args = p.parse_args(argv)
    for field, value in SHAPES[args.shape].items():
        if getattr(args, field) is None:
            setattr(args, field, value)
    if args.hidden % args.heads or args.heads % args.kv_heads:
        p.error("--hidden must be a multiple of --heads, and --heads of --kv-heads")
    if args.context < 1 or args.max_new < 1:
        p.error("--context and --max-new must be at least 1")
    if args.context + args.max_new > args.max_cache_len:
        p.error(f"--context + --max-new ({args.context + args.max_new}) exceeds "
                f"--max-cache-len ({args.max_cache_len})")
    return args


def build_model(args, torch, device, dtype):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_hidden_layers=args.layers, num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads, head_dim=args.hidden // args.heads,
        rms_norm_eps=1e-5, hidden_act="silu", tie_word_embeddings=False,
        max_position_embeddings=max(131072, args.max_cache_len), rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        bos_token_id=None, eos_token_id=None, pad_token_id=None)
    config.attn_implementation = args.attn
    with torch.device(device):
        model = LlamaForCausalLM._from_config(config, dtype=dtype)
    model.eval()
    # Wider than the default init (std 0.02), so that the logits have clear maxima and a greedy
    # choice is not decided by rounding. Drawn on the model's device, in float32, then cast.
    generator = torch.Generator(device=device).manual_seed(args.seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                value = 1 + 0.1 * torch.randn(param.shape, generator=generator, device=device)
            elif param.dim() == 1:
                value = 0.1 * torch.randn(param.shape, generator=generator, device=device)
            else:
                value = torch.randn(param.shape, generator=generator, device=device)
                value /= param.shape[1] ** 0.5
            param.copy_(value)
            del value
    return model


def make_prompt(args, torch):
    generator = torch.Generator().manual_seed(args.seed + 1000003)
    return torch.randint(0, args.vocab, (args.context,), generator=generator).tolist()


def run_transformers(args, torch, model, prompt, device):
    from transformers import GenerationConfig, StaticCache
    from transformers.generation.streamers import BaseStreamer

    offloading = device == "cuda"
    input_ids = torch.tensor([prompt], dtype=torch.long, device=device)
    attention_mask = torch.ones_like(input_ids)

    class Stamps(BaseStreamer):
        """Records when generate hands over the prompt and then each new token."""

        def __init__(self):
            self.times, self.tokens = [], []

        def put(self, value):
            self.times.append(time.perf_counter())
            if len(self.times) > 1:
                self.tokens.extend(int(t) for t in value.reshape(-1).tolist())

        def end(self):
            pass

    def generate(new_tokens):
        cache = StaticCache(config=model.config, max_cache_len=args.max_cache_len,
                            offloading=offloading)
        config = GenerationConfig(do_sample=False, max_new_tokens=new_tokens, min_new_tokens=0,
                                  eos_token_id=None, bos_token_id=None, pad_token_id=0,
                                  use_cache=True, disable_compile=not args.compile)
        stamps = Stamps()
        with torch.no_grad():
            out = model.generate(input_ids=input_ids, attention_mask=attention_mask, cache=cache,
                                 generation_config=config, streamer=stamps)
        tokens = out[0, input_ids.shape[1]:].tolist()
        del cache, out
        if len(tokens) != new_tokens or stamps.tokens != tokens or len(stamps.times) != new_tokens + 1:
            raise RuntimeError(f"transformers generated {len(tokens)} tokens ({len(stamps.times)} "
                               f"streamer calls), not {new_tokens}")
        return stamps.times, tokens

    for _ in range(args.warmup):
        generate(min(2, args.max_new))

    best, peak = None, None
    for _ in range(max(1, args.repeat)):
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        times, tokens = generate(args.max_new)
        if device == "cuda":
            peak = max(peak or 0, torch.cuda.max_memory_allocated())
        run = {"prefill_s": times[1] - times[0], "decode_s": times[-1] - times[1], "tokens": tokens}
        if best is not None and tokens != best["tokens"]:
            print("warning: transformers produced different tokens across repeats", file=sys.stderr)
        if best is None or run["decode_s"] < best["decode_s"]:
            best = run

    decode_steps = args.max_new - 1
    return {
        "cache": "StaticCache(offloading=True)" if offloading else "StaticCache",
        "compiled": bool(args.compile and device == "cuda"),
        "tokens": best["tokens"],
        "prefill_tokens": args.context,
        "prefill_s": best["prefill_s"],
        "prefill_tokens_per_s": args.context / best["prefill_s"],
        "decode_tokens": decode_steps,
        "decode_s": best["decode_s"],
        "decode_tokens_per_s": decode_steps / best["decode_s"] if decode_steps else None,
        "peak_device_bytes": peak,
    }


def run_kvo(args, prompt_file):
    cmd = [args.kvo_generate, "--model", args.out, "--prompt-tokens", prompt_file,
           "--max-new", str(args.max_new), "--max-seq", str(args.max_cache_len),
           "--json", "--quiet"] + shlex.split(args.kvo_args)
    print("running:", " ".join(shlex.quote(c) for c in cmd), flush=True)
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout + proc.stderr)
        raise RuntimeError(f"kvo-generate exited with status {proc.returncode}")
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    for line in reversed(lines):
        if line.lstrip().startswith("{"):
            result = json.loads(line)
            break
    else:
        sys.stderr.write(proc.stdout + proc.stderr)
        raise RuntimeError("kvo-generate printed no JSON line")
    result["command"] = cmd
    result["tokens"] = result["tokens"][0]  # one slot
    return result


def fmt(value, kind):
    if value is None:
        return "n/a"
    if kind == "bytes":
        return f"{value / 2**20:.1f} MiB ({value})"
    if kind == "rate":
        return f"{value:.2f}"
    if kind == "s":
        return f"{value:.4f}"
    return str(value)


def leading_agreement(a, b):
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def main(argv=None):
    args = parse_args(argv)
    import torch

    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        print("hf_compare: --device cuda, but torch sees no GPU", file=sys.stderr)
        return 2
    dtype_name = args.dtype or ("bfloat16" if device == "cuda" else "float32")
    dtype = getattr(torch, dtype_name)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    if not os.path.isfile(args.kvo_generate):
        print(f"hf_compare: no kvo-generate at {args.kvo_generate} (build it, or pass "
              "--kvo-generate)", file=sys.stderr)
        return 2
    torch.manual_seed(args.seed)

    # 1-2. Model and prompt, written where kvo-generate reads them.
    start = time.perf_counter()
    model = build_model(args, torch, device, dtype)
    os.makedirs(args.out, exist_ok=True)
    model.save_pretrained(args.out, safe_serialization=True)
    prompt = make_prompt(args, torch)
    prompt_file = os.path.join(args.out, "prompt.txt")
    with open(prompt_file, "w") as f:
        f.write(" ".join(str(t) for t in prompt) + "\n")
    setup_s = time.perf_counter() - start
    params = sum(p.numel() for p in model.parameters())
    print(f"model: {args.layers} layers, hidden {args.hidden}, intermediate {args.intermediate}, "
          f"heads {args.heads}/{args.kv_heads} kv, vocab {args.vocab}, {params / 1e6:.1f} M "
          f"parameters, {dtype_name}, on {device}; saved to {args.out} in {setup_s:.1f} s")
    print(f"prompt: {args.context} tokens (seed {args.seed}), max_cache_len {args.max_cache_len}, "
          f"max_new {args.max_new}", flush=True)

    # 3. transformers.
    hf = run_transformers(args, torch, model, prompt, device)
    print(f"transformers ({hf['cache']}): done", flush=True)
    del model
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()

    # 4. kvo-generate on the saved weights.
    kvo = run_kvo(args, prompt_file)

    # 5. Side by side.
    agree = leading_agreement(hf["tokens"], kvo["tokens"])
    required = min(args.require_agree, args.max_new)
    rows = [
        ("cache", hf["cache"], f"kvoffload ({kvo.get('backend')}, resident "
                               f"{kvo.get('resident_layers')}, streamed {kvo.get('streamed_layers')}, "
                               f"ring {kvo.get('ring_depth')})", None),
        ("prefill tokens/s", hf["prefill_tokens_per_s"], kvo.get("prefill_tokens_per_s"), "rate"),
        ("decode tokens/s", hf["decode_tokens_per_s"], kvo.get("decode_tokens_per_s"), "rate"),
        ("decode time (s)", hf["decode_s"], kvo.get("decode_s"), "s"),
        ("peak device bytes", hf["peak_device_bytes"],
         kvo.get("peak_device_bytes") if kvo.get("backend") == "cuda" else None, "bytes"),
        ("planned device bytes", None, kvo.get("planned_device_bytes"), "bytes"),
        ("first tokens", " ".join(map(str, hf["tokens"][:8])),
         " ".join(map(str, kvo["tokens"][:8])), None),
    ]
    print()
    print(f"| {args.context} prompt tokens, max_cache_len {args.max_cache_len}, "
          f"{args.max_new} new, {dtype_name} | transformers | kvo-generate |")
    print("|---|---|---|")
    for name, a, b, kind in rows:
        print(f"| {name} | {fmt(a, kind)} | {fmt(b, kind)} |")
    print()
    ok = agree >= required
    print(f"leading generated tokens that agree: {agree} of {args.max_new}")
    print(f"first {required} tokens agree: {'yes' if ok else 'no'}")

    if args.json:
        record = {
            "shape": {k: getattr(args, k) for k in SHAPES["small"]},
            "context": args.context, "max_cache_len": args.max_cache_len,
            "max_new": args.max_new, "dtype": dtype_name, "device": device, "seed": args.seed,
            "parameters": params, "torch": torch.__version__,
            "transformers": __import__("transformers").__version__,
            "gpu": torch.cuda.get_device_name() if device == "cuda" else None,
            "transformers_run": hf, "kvo_generate_run": kvo,
            "agreeing_leading_tokens": agree, "required_agreeing_tokens": required, "agree": ok,
        }
        with open(args.json, "w") as f:
            json.dump(record, f, indent=2)
        print(f"wrote {args.json}")

    if not ok:
        first = agree
        print(f"hf_compare: MISMATCH: the generated tokens differ at position {first} "
              f"(transformers {hf['tokens'][first:first + 4]}, kvo-generate "
              f"{kvo['tokens'][first:first + 4]}); {required} leading tokens had to agree",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (RuntimeError, OSError, subprocess.SubprocessError) as e:
        print(f"hf_compare: {e}", file=sys.stderr)
        sys.exit(2)
