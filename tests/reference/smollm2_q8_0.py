"""kvo-generate --weights q8_0 quantizes a safetensors checkpoint into GGUF's Q8_0 blocks at load
as ggml's reference quantizer does: SmolLM2-135M-Instruct quantized so must generate exactly the
tokens of a GGUF file written from the same weights by the gguf package's quantizer
(gguf.quants.quantize, Q8_0), streamed and resident, after 700 tokens of English text; and both
stay close to float32 transformers (their agreement is printed, not required).

kvo-generate --weights int8 quantizes each matrix per output channel (one f16 scale per row,
max |row| / 127): its tokens must equal float32 transformers' run on the same per-row quantized
weights (quantized here in numpy by that rule), streamed and resident.

    python smollm2_q8_0.py --model DIR --kvo-generate PATH [--max-new 48]
"""
import argparse
import os
import sys
import tempfile

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from kvo_generate import generate_tokens

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools"))
from hf_reference import write_gguf  # noqa: E402

TEXT = "/usr/share/common-licenses/Apache-2.0"


def int8_rows(w):
    """w [rows][cols] quantized per row as kvo-generate --weights int8 does, and dequantized:
    d = max |row| / 127 (f32), q = round half away from zero of w * (1 / d) (f32), d stored as f16."""
    w = w.astype(np.float32)
    d = np.abs(w).max(axis=1, keepdims=True) / np.float32(127)
    inv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, 1), 0).astype(np.float32)
    v = (w * inv).astype(np.float64)
    q = np.sign(v) * np.floor(np.abs(v) + 0.5)
    return (q * d.astype(np.float16).astype(np.float64)).astype(np.float32)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--kvo-generate", required=True)
    p.add_argument("--max-new", type=int, default=48)
    p.add_argument("--prompt-tokens", type=int, default=700)
    args = p.parse_args()

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    with open(TEXT, encoding="utf-8") as f:
        ids = tokenizer(f.read())["input_ids"][: args.prompt_tokens]
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=args.max_new, do_sample=False,
                             eos_token_id=None, pad_token_id=0)
    f32 = out[0, len(ids):].tolist()

    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        gguf_path = os.path.join(tmp, "q8_0.gguf")
        write_gguf(model, "llama", "Q8_0", gguf_path, np.random.default_rng(0))
        for resident in ("all", "1"):
            quantized = generate_tokens(args.kvo_generate, args.model, ids, args.max_new,
                                        "--weights", "q8_0", "--resident", resident)
            from_file = generate_tokens(args.kvo_generate, gguf_path, ids, args.max_new,
                                        "--resident", resident, "--activations", "f32")
            same = quantized == from_file
            agree = next((i for i, (a, b) in enumerate(zip(quantized, f32)) if a != b),
                         len(quantized))
            print(f"--resident {resident}: --weights q8_0 identical to the gguf package's Q8_0 "
                  f"file: {'yes' if same else 'no'}; first {agree} of {args.max_new} tokens as "
                  f"float32 transformers'")
            if not same:
                print(f"  --weights q8_0: {quantized}\n  Q8_0 file:      {from_file}")
                failed = True

    # int8 per output channel against transformers on the same quantized weights.
    matrices = 0
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() == 2:  # the embedding (tied to the output) and every projection
                param.copy_(torch.from_numpy(int8_rows(param.numpy())))
                matrices += 1
        out = model.generate(torch.tensor([ids]), max_new_tokens=args.max_new, do_sample=False,
                             eos_token_id=None, pad_token_id=0)
    reference = out[0, len(ids):].tolist()
    for resident in ("all", "1"):
        int8 = generate_tokens(args.kvo_generate, args.model, ids, args.max_new, "--weights",
                               "int8", "--resident", resident)
        same = int8 == reference
        print(f"--resident {resident}: --weights int8 identical to float32 transformers on the "
              f"same per-row quantized weights ({matrices} matrices): {'yes' if same else 'no'}")
        if not same:
            print(f"  --weights int8: {int8}\n  transformers:   {reference}")
            failed = True
    print("all identical" if not failed else "some differ")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
