"""SmolLM2-135M-Instruct, real weights and real English text: kvo-generate's greedy tokens must be
exactly transformers' (float32, CPU), streamed (every layer but one through the staging ring) and
all resident.

    python smollm2_greedy.py --model DIR --kvo-generate PATH [--prompt-tokens 400 --max-new 32]
"""
import argparse
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from kvo_generate import generate_tokens

TEXT = "/usr/share/common-licenses/Apache-2.0"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--kvo-generate", required=True)
    p.add_argument("--prompt-tokens", type=int, default=400)
    p.add_argument("--max-new", type=int, default=32)
    args = p.parse_args()

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    with open(TEXT, encoding="utf-8") as f:
        ids = tokenizer(f.read())["input_ids"][: args.prompt_tokens]
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=args.max_new, do_sample=False,
                             eos_token_id=None, pad_token_id=0)
    expected = out[0, len(ids):].tolist()

    failed = False
    for resident in ("all", "1"):
        got = generate_tokens(args.kvo_generate, args.model, ids, args.max_new, "--resident",
                              resident)
        same = got == expected
        print(f"--resident {resident}: {len(ids)} prompt tokens, {args.max_new} new, "
              f"identical to transformers: {'yes' if same else 'no'}")
        if not same:
            print(f"  transformers: {expected}\n  kvo-generate: {got}")
            failed = True
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
