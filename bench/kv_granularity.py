"""What scale granularity fp8 K/V would need: quantized K/V caches of other formats emulated on
SmolLM2-135M with transformers (the format kvoffload stores, and finer or mixed ones it does not),
against bf16 K/V, on real text. Figures: bench/results/kv-quant-*.md.

Every attention call reads fake-quantized (quantize -> dequantize) keys (after RoPE) and values
for all positions, including the current token's own: a teacher-forced single forward.
Usage: SEEDS=3 python kv_granularity.py MODEL_DIR [TOKENS=4096] [OUT_MD=kv_granularity.md]
"""
import json
import math
import sys
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

torch.set_num_threads(1)
MODEL = sys.argv[1]
TOKENS = int(sys.argv[2]) if len(sys.argv) > 2 else 4096
OUT_MD = sys.argv[3] if len(sys.argv) > 3 else "kv_granularity.md"
TEXT = "/usr/share/common-licenses/GPL-3"
HEAD_DIM = 64


# ---- quantizers on [B, H, T, D] f32 tensors, groups along D -------------------------------
def _grouped(x, group):
    shape = x.shape
    return x.reshape(*shape[:-1], shape[-1] // group, group), shape


def fq_int8(x, group=HEAD_DIM):
    g, shape = _grouped(x, group)
    scale = g.abs().amax(-1, keepdim=True) / 127.0
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    q = torch.round(g / scale).clamp(-127, 127)  # torch.round: half to even
    return (q * scale).reshape(shape)


def fq_fp8(x, group=HEAD_DIM, dtype=torch.float8_e4m3fn, fixed_scale=None):
    fmax = torch.finfo(dtype).max  # 448 (e4m3fn) / 57344 (e5m2)
    g, shape = _grouped(x, group)
    if fixed_scale is None:
        scale = g.abs().amax(-1, keepdim=True) / fmax
        scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    else:
        scale = torch.tensor(fixed_scale, dtype=x.dtype)
    q = (g / scale).clamp(-fmax, fmax).to(dtype).to(torch.float32)  # RNE, saturating
    return (q * scale).reshape(shape)


def fq_bf16(x):
    return x.to(torch.bfloat16).to(torch.float32)


def ident(x):
    return x


# name -> (K quantizer, V quantizer, bytes per element incl. f32 scales at head_dim 64)
E4 = torch.float8_e4m3fn
E5 = torch.float8_e5m2
VARIANTS = {
    "bf16 (reference)": (fq_bf16, fq_bf16, 2.0),
    "f32 (no quantization)": (ident, ident, 4.0),
    "int8 per-(token,head)": (fq_int8, fq_int8, 1 + 4 / 64),
    "(a) fp8 e4m3 per-(token,head)": (fq_fp8, fq_fp8, 1 + 4 / 64),
    "(b) fp8 e4m3 group 32": (lambda x: fq_fp8(x, 32), lambda x: fq_fp8(x, 32), 1 + 4 / 32),
    "(b) fp8 e4m3 group 16": (lambda x: fq_fp8(x, 16), lambda x: fq_fp8(x, 16), 1 + 4 / 16),
    "(c) fp8 e4m3 per-tensor scale 1.0": (
        lambda x: fq_fp8(x, fixed_scale=1.0), lambda x: fq_fp8(x, fixed_scale=1.0), 1.0),
    "(d) K int8 + V fp8 e4m3 (per-(token,head))": (fq_int8, fq_fp8, 1 + 4 / 64),
    "(e) K fp8 e4m3 + V int8 (per-(token,head))": (fq_fp8, fq_int8, 1 + 4 / 64),
    "(f) fp8 e5m2 per-(token,head)": (
        lambda x: fq_fp8(x, dtype=E5), lambda x: fq_fp8(x, dtype=E5), 1 + 4 / 64),
}
if len(sys.argv) > 4:
    VARIANTS = {k: v for k, v in VARIANTS.items() if k in set(sys.argv[4].split("|"))}

CURRENT = [ident, ident]
SEEDS = int(__import__("os").environ.get("SEEDS", "2"))
# Seed 0: the exact rows. Seed s > 0: every K/V element first multiplied by (1 + 1e-6 * N(0, 1))
# (a generator seeded per forward), which only moves elements that sit within ~1e-6 of a rounding
# boundary: an independent draw of the same quantizer, to show how much of a top-1 figure is luck.
DITHER = [None]


def dither(x):
    g = DITHER[0]
    if g is None:
        return x
    return x * (1 + 1e-6 * torch.randn(x.shape, generator=g, dtype=x.dtype))


def fq_attention(module, query, key, value, attention_mask, **kwargs):
    # key: [B, kv_heads, T, head_dim] after RoPE; value likewise: the rows a K/V cache stores.
    return sdpa_attention_forward(module, query, CURRENT[0](dither(key)), CURRENT[1](dither(value)),
                                  attention_mask, **kwargs)


AttentionInterface.register("fq_sdpa", fq_attention)


def forward(model, x, targets, ref_logp=None):
    with torch.no_grad():
        logits = model(input_ids=x, use_cache=False).logits[0, :-1]
    logp = torch.log_softmax(logits, -1)
    del logits
    nll = -logp.gather(1, targets[:, None])[:, 0].double()
    top1 = logp.argmax(-1)
    kl = None
    if ref_logp is not None:  # KL(bf16 || variant) per position, in nats
        kl = torch.cat([(ref_logp[i:i + 512].exp() * (ref_logp[i:i + 512] - logp[i:i + 512]))
                        .sum(-1).double() for i in range(0, logp.shape[0], 512)])
        return nll, top1, kl, None
    return nll, top1, kl, logp


def main():
    tok = AutoTokenizer.from_pretrained(MODEL)
    ids = tok(open(TEXT).read())["input_ids"][:TOKENS]  # no BOS is added for this tokenizer
    assert len(ids) == TOKENS
    model = AutoModelForCausalLM.from_pretrained(
        MODEL, dtype=torch.float32, attn_implementation="fq_sdpa").eval()
    x = torch.tensor([ids])
    targets = x[0, 1:]
    cuts = [n for n in (1024, 4096) if n <= TOKENS]

    CURRENT[0], CURRENT[1] = fq_bf16, fq_bf16
    DITHER[0] = None
    ref_nll, ref_top1, _, ref_logp = forward(model, x, targets)
    rows = []
    for name, (kq, vq, bpe) in VARIANTS.items():
        row = dict(variant=name, bytes_per_element=bpe, seeds=[])
        for seed in range(1 if name.startswith("bf16") else SEEDS):
            CURRENT[0], CURRENT[1] = kq, vq
            DITHER[0] = None if seed == 0 else torch.Generator().manual_seed(seed)
            t0 = time.time()
            if name.startswith("bf16"):  # the reference itself, not run again
                nll, top1, kl = ref_nll, ref_top1, torch.zeros_like(ref_nll)
            else:
                nll, top1, kl, _ = forward(model, x, targets, ref_logp)
            r = dict(seed=seed)
            for n in cuts:
                p = n - 1  # scored positions among the first n tokens
                r[f"ppl_{n}"] = math.exp(nll[:p].mean().item())
                r[f"ppl_change_{n}"] = 100 * (r[f"ppl_{n}"] / math.exp(ref_nll[:p].mean().item()) - 1)
                r[f"top1_{n}"] = 100 * (top1[:p] == ref_top1[:p]).double().mean().item()
                r[f"kl_{n}"] = kl[:p].mean().item()
            row["seeds"].append(r)
            print(name, json.dumps(r), f"{time.time() - t0:.1f} s", flush=True)
        rows.append(row)

    def cell(row, key, fmt):
        vals = [fmt % r[key] for r in row["seeds"]]
        return " / ".join(vals)

    lines = ["| variant | B/elem | " + " | ".join(
        f"ppl@{n} vs bf16 | top-1@{n} vs bf16 | KL@{n} (1e-3 nats)" for n in cuts) + " |",
        "|---|---|" + "---|---|---|" * len(cuts)]
    for row in rows:
        cells = [row["variant"], f"{row['bytes_per_element']:.4f}"]
        for n in cuts:
            cells.append(cell(row, f"ppl_change_{n}", "%+.2f %%"))
            cells.append(cell(row, f"top1_{n}", "%.2f %%"))
            cells.append(" / ".join("%.2f" % (1e3 * r[f"kl_{n}"]) for r in row["seeds"]))
        lines.append("| " + " | ".join(cells) + " |")
    table = "\n".join(lines)
    print(table)
    ref_ppl = {n: math.exp(ref_nll[:n - 1].mean().item()) for n in cuts}
    with open(OUT_MD, "w") as f:
        f.write(f"SmolLM2-135M-Instruct, f32 weights, sdpa, teacher-forced single forward over the "
                f"first {TOKENS} tokens of {TEXT} (no BOS); the @1024 columns are the first 1023 "
                f"scored positions of the same forward. bf16 K/V perplexity: "
                + ", ".join(f"{ref_ppl[n]:.4f} @{n}" for n in cuts)
                + f". Each cell: seed 0 (exact rows) / seeds 1..{SEEDS - 1} (rows dithered by "
                f"1e-6 relative before quantizing: another draw of the same rounding).\n\n"
                f"{table}\n")
    with open(OUT_MD.replace(".md", ".json"), "w") as f:
        json.dump(dict(ref_ppl=ref_ppl, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
