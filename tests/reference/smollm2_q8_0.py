"""kvo-generate --weights q8_0 quantizes a safetensors checkpoint into GGUF's Q8_0 blocks at load
as ggml's reference quantizer does: SmolLM2-135M-Instruct quantized so must generate exactly the
tokens of a GGUF file written from the same weights by the gguf package's quantizer
(gguf.quants.quantize, Q8_0), streamed and resident, after 700 tokens of English text; and both
stay close to float32 transformers (their agreement is printed, not required).

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
                                        "--resident", resident)
            same = quantized == from_file
            agree = next((i for i, (a, b) in enumerate(zip(quantized, f32)) if a != b),
                         len(quantized))
            print(f"--resident {resident}: --weights q8_0 identical to the gguf package's Q8_0 "
                  f"file: {'yes' if same else 'no'}; first {agree} of {args.max_new} tokens as "
                  f"float32 transformers'")
            if not same:
                print(f"  --weights q8_0: {quantized}\n  Q8_0 file:      {from_file}")
                failed = True
    print("all identical" if not failed else "some differ")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
