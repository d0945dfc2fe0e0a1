"""Writes the seed corpora of the text and saved-context fuzz targets: tokenizer.json files as the
byte-level BPE tokenizers of real models write them (the test tokenizer of tests/tools/data and
variants of it with each normalizer, pre-tokenizer and post-processor the loader serves), a real
model's tokenizer_config.json and generation_config.json (SmolLM2-135M-Instruct's) and variants,
prompt text in several scripts, and saved contexts that kvo-generate wrote. Standard library only;
run once with built tools, the outputs are kept in tests/fuzz/corpus/.

    python make_text_seeds.py --smollm2 DIR --make-model build/tools/kvo-make-model \
        --generate build/tools/kvo-generate --out corpus
"""
import argparse
import copy
import hashlib
import json
import os
import subprocess
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "tools", "data")


def put(out, target, data):
    """Stores `data` under its content hash, as libFuzzer names corpus files (as make_seeds.py)."""
    folder = os.path.join(out, target)
    os.makedirs(folder, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(folder, hashlib.sha1(data).hexdigest()), "wb") as f:
        f.write(data)


def put_file(out, target, path):
    with open(path, "rb") as f:
        put(out, target, f.read())


def tokenizer_variants(base):
    yield base
    nfc = copy.deepcopy(base)
    nfc["normalizer"] = {"type": "NFC"}
    nfc["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?"
                                               r"\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
                                               r"\s+(?!\S)|\s+"},
         "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}]}
    yield nfc
    digits = copy.deepcopy(base)
    digits["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithNext"},
        {"type": "ByteLevel", "add_prefix_space": True}]}
    yield digits
    template = copy.deepcopy(base)
    template["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<|end|>", "type_id": 0}},
                   {"Sequence": {"id": "A", "type_id": 0}},
                   {"SpecialToken": {"id": "<|end|>", "type_id": 0}}],
        "pair": [], "special_tokens": {"<|end|>": {"id": "<|end|>", "ids": [261],
                                                  "tokens": ["<|end|>"]}}}
    template["added_tokens"].append({"id": 262, "content": "<|im_start|>", "single_word": False,
                                     "lstrip": True, "rstrip": True, "normalized": False,
                                     "special": True})
    yield template
    pairs = copy.deepcopy(base)
    pairs["model"]["merges"] = [m.split(" ") for m in base["model"]["merges"]]
    pairs["model"]["ignore_merges"] = True
    yield pairs


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--smollm2", required=True)
    p.add_argument("--make-model", required=True)
    p.add_argument("--generate", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    with open(os.path.join(DATA, "tokenizer.json"), encoding="utf-8") as f:
        base = json.load(f)
    for variant in tokenizer_variants(base):
        put(args.out, "fuzz_tokenizer_json", json.dumps(variant, ensure_ascii=False))

    put_file(args.out, "fuzz_tokenizer_config", os.path.join(args.smollm2, "tokenizer_config.json"))
    put_file(args.out, "fuzz_tokenizer_config", os.path.join(DATA, "tokenizer_config.json"))
    with open(os.path.join(args.smollm2, "chat_template.jinja"), encoding="utf-8") as f:
        template = f.read()
    put(args.out, "fuzz_tokenizer_config", json.dumps({
        "bos_token": {"content": "<|im_start|>", "lstrip": False}, "eos_token": "<|im_end|>",
        "add_bos_token": False, "chat_template": template}))
    put(args.out, "fuzz_tokenizer_config", json.dumps({"chat_template": [
        {"name": "default", "template": template}], "eos_token": None}))

    put_file(args.out, "fuzz_generation_config", os.path.join(args.smollm2, "generation_config.json"))
    put(args.out, "fuzz_generation_config", '{"eos_token_id": [2, 128001, 128009], "do_sample": true}')

    for text in ["The cache keeps the full-length keys and values in pinned host memory.",
                 "Grüße, naïve café — e\u0301 and \u00e9; 東京 ｶﾀｶﾅ; مرحبا; 🙂👍🏽\n",
                 "digits 0123456789 and ١٢٣ and 12.5e-3\t\ttabs\r\n  spaces   ",
                 "a\x00b <|end|> c <|im_start|> d", "\u0301\u0301 leading marks"]:
        put(args.out, "fuzz_prompt_text", text)

    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "model")
        subprocess.run([args.make_model, "--out", model, "--layers", "3", "--hidden", "32",
                        "--intermediate", "48", "--heads", "4", "--kv-heads", "2", "--head-dim",
                        "4", "--vocab", "300"], check=True, stdout=subprocess.DEVNULL)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            with open(os.path.join(DATA, name), "rb") as src, \
                    open(os.path.join(model, name), "wb") as dst:
                dst.write(src.read())
        for i, (prompt, extra) in enumerate([("hello the", []), ("he", ["--kv-dtype", "int8"]),
                                             ("hello there", ["--kv-dtype", "fp8", "--slots", "2"]),
                                             ("the hell", ["--kv-dtype", "bf16"])]):
            saved = os.path.join(tmp, f"c{i}.kvo")
            subprocess.run([args.generate, "--backend", "host", "--model", model, "--prompt",
                            prompt, "--max-new", "1", "--max-seq", "16", "--quiet",
                            "--save-context", saved] + extra, check=True, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
            put_file(args.out, "fuzz_saved_context", saved)


if __name__ == "__main__":
    main()
