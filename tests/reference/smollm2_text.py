"""SmolLM2-135M-Instruct asked a real question about a real document (the Apache License 2.0, a few
thousand tokens), text in and text out:

1. kvo-generate --chat --prompt-file gives the ids of transformers' apply_chat_template and its
   exact greedy text (float32, CPU), streamed (one layer resident, the rest through the staging
   ring) and all resident; the text streamed to stdout is the text of the JSON line.
2. The document prefilled once with --save-context, then the question asked with
   --load-context, generates exactly the tokens of one run that prefilled the document and the
   question together; the loading run reports that it skipped the prefill and how long the load
   took.

    python smollm2_text.py --model DIR --kvo-generate PATH
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

DOCUMENT = "/usr/share/common-licenses/Apache-2.0"
QUESTION = "Under this license, what must a redistribution of the work include?"
MAX_NEW = 48


def kvo(tool, *args):
    run = subprocess.run([tool, "--backend", "host", "--chunk", "256", "--json", *args],
                         capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"kvo-generate {' '.join(args)} failed:\n{run.stdout}\n{run.stderr}")
    lines = run.stdout.rstrip("\n").split("\n")
    return json.loads(lines[-1]), "\n".join(lines[:-1]), run.stderr


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--kvo-generate", required=True)
    args = p.parse_args()
    with open(DOCUMENT, encoding="utf-8") as f:
        document = f.read()

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    messages = [{"role": "user", "content": document + "\n\n" + QUESTION}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                        return_dict=True)["input_ids"]
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=MAX_NEW, do_sample=False)
    expected = out[0, len(ids):].tolist()
    expected_text = tokenizer.decode(expected, skip_special_tokens=True)
    print(f"document: {len(ids)} prompt tokens; transformers: {len(expected)} new tokens: "
          f"{expected_text!r}")

    failed = []
    with tempfile.TemporaryDirectory() as tmp:
        whole = os.path.join(tmp, "whole.txt")
        with open(whole, "w", encoding="utf-8") as f:
            f.write(document + "\n\n" + QUESTION)
        for resident in ("1", "all"):
            got, streamed, _ = kvo(args.kvo_generate, "--model", args.model, "--prompt-file", whole,
                                   "--chat", "--max-new", str(MAX_NEW), "--resident", resident)
            same = (got["prefill_tokens"] == len(ids) and got["tokens"][0] == expected and
                    got["text"][0] == expected_text and streamed == expected_text)
            print(f"--resident {resident}: {got['prefill_tokens']} prompt tokens, "
                  f"{got['streamed_layers']} layers streamed, text identical to transformers: "
                  f"{'yes' if same else 'no'}")
            if not same:
                print(f"  kvo-generate: {got['tokens'][0]}\n  transformers: {expected}\n"
                      f"  streamed: {streamed!r}\n  json: {got['text'][0]!r}")
                failed.append(f"--resident {resident}")

        doc = os.path.join(tmp, "document.txt")
        with open(doc, "w", encoding="utf-8") as f:
            f.write(document)
        context = os.path.join(tmp, "document.kvo")
        common = ["--model", args.model, "--chat", "--resident", "2"]
        together, _, _ = kvo(args.kvo_generate, *common, "--prompt-file", doc, "--prompt", QUESTION,
                             "--max-new", str(MAX_NEW))
        _, _, saved_log = kvo(args.kvo_generate, *common, "--prompt-file", doc, "--max-new", "0",
                              "--save-context", context)
        loaded, answer, loaded_log = kvo(args.kvo_generate, *common, "--load-context", context,
                                         "--prompt", QUESTION, "--max-new", str(MAX_NEW))
        report = [line.strip() for line in loaded_log.splitlines() if "prefill skipped" in line]
        same = (loaded["tokens"] == together["tokens"] and loaded["prefill_skipped"] and
                loaded["context_loaded_tokens"] + loaded["prefill_tokens"] ==
                together["prefill_tokens"] and report)
        print(f"saved once, then asked: {loaded['context_loaded_tokens']} tokens restored in "
              f"{loaded['context_load_s']:.3f} s, {loaded['prefill_tokens']} question tokens "
              f"prefilled; tokens identical to one run of document + question: "
              f"{'yes' if same else 'no'}\n  {report[0] if report else 'no report of the load'}"
              f"\n  answer: {answer!r}")
        if not same:
            print(f"  together: {together['tokens']}\n  loaded:   {loaded['tokens']}\n{saved_log}")
            failed.append("save and load")
    print("all identical" if not failed else f"differ: {', '.join(failed)}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
