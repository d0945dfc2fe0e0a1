"""kvo-tokenize against transformers' tokenizers on real multilingual text: the same ids, and the
same decoded text (which is the input again wherever transformers' own round trip is exact).

- SmolLM2-135M-Instruct's byte-level BPE (tokenizer.json), as the model directory has it, and
  variants of it that switch on the other parts a tokenizer.json may use: Llama 3's Split regex
  with ignore_merges and a BOS post-processor, Qwen2's NFC normalizer and regex, Digits, and
  tokenizer_config.json asking for BOS/EOS (which transformers 5 leaves unapplied for a
  tokenizer.json: the ids must stay the same as without).
- A SentencePiece model (tokenizer.model) trained here with the SentencePiece library, the way
  Llama 2's was made (BPE, byte fallback, identity normalization, digits split).
- SmolLM2's GGUF file (model.gguf beside the model), the tokenizer inside it against transformers'
  AutoTokenizer.from_pretrained(..., gguf_file=...), and copies of its tokenizer naming Llama 3's
  and Qwen2's pre-tokenizers (tokenizer.ggml.pre llama-bpe and qwen2) and with its tokens written
  in plain UTF-8 (respelled into the byte alphabet on reading, as transformers respells them);
  and the SentencePiece model above written as GGUF "llama" vocabularies of a Llama and a Phi-3
  file (read through the SentencePiece library; transformers rebuilds them as BPE).

    python tokenizer_equality.py --model SMOLLM2_DIR --kvo-tokenize PATH [--gguf]

--gguf compares the GGUF tokenizers alone (a test of its own: transformers builds each from the
file in Python, slowly); without it, the rest.
"""
import argparse
import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile

from transformers import AutoTokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

# Article 1 of the Universal Declaration of Human Rights in its official translations.
CHINESE = "人人生而自由,在尊严和权利上一律平等。他们赋有理性和良心,并应以兄弟关系的精神相对待。"
JAPANESE = ("すべての人間は、生まれながらにして自由であり、かつ、尊厳と権利とについて平等である。"
            "人間は、理性と良心とを授けられており、互いに同胞の精神をもって行動しなければならない。")
KOREAN = ("모든 인간은 태어날 때부터 자유로우며 그 존엄과 권리에 있어 동등하다. 인간은 천부적으로 "
          "이성과 양심을 부여받았으며 서로 형제애의 정신으로 행동하여야 한다.")
ARABIC = ("يولد جميع الناس أحرارًا متساوين في الكرامة والحقوق. وقد وهبوا عقلاً وضميرًا وعليهم أن "
          "يعامل بعضهم بعضًا بروح الإخاء.")
EMOJI = ("Family 👨\u200d👩\u200d👧\u200d👦, flags 🇫🇷🇯🇵🇧🇷, tones 👍🏽👋🏿, a burning heart "
         "❤️\u200d🔥, keycap 1️⃣ and plain 🙂🚀✨.")
WHITESPACE = ("a  b   c\t\td\n\n\n  e \r\n f      \n\t \u00a0x\u3000y\u2003z   \n\n"
              "indented:\n    four\n\ttab\n        eight   ")


def texts(special_tokens):
    with open("/usr/share/common-licenses/Apache-2.0", encoding="utf-8") as f:
        english = f.read()[:6000]
    with open(os.path.join(ROOT, "model", "text", "tokenizer_bpe.cpp"), encoding="utf-8") as f:
        cpp = f.read()[:5000]
    with open(os.path.join(ROOT, "tools", "smollm2_convert.py"), encoding="utf-8") as f:
        python = f.read()
    a, b, c = special_tokens
    specials = (f"{a}user\nWhat is 2+2?{b}\n{a}assistant\n4{b}\n{c}  {a}{a}x{b}y"
                f" and a partial {a[:-1]} one")
    return {
        "english": english, "code (C++)": cpp, "code (Python)": python, "chinese": CHINESE,
        "japanese": JAPANESE, "korean": KOREAN, "arabic": ARABIC, "emoji": EMOJI,
        "whitespace runs": WHITESPACE, "special tokens": specials,
        "numbers": "Pi is 3.14159265358979, 1234567 and 2024-06-30; ١٢٣ ٤٥٦.",
        "mixed": english[:300] + CHINESE + ARABIC + EMOJI + WHITESPACE + specials,
    }


def run(tool, model, text, *flags):
    out = subprocess.run([tool, "--model", model, *flags], input=text.encode("utf-8"),
                         capture_output=True)
    if out.returncode != 0:
        sys.exit(f"kvo-tokenize failed on {model}: {out.stderr.decode()}")
    return out.stdout.decode("utf-8")


def compare(tool, model, name, sample_texts, reference=None):
    if reference is None:
        reference = AutoTokenizer.from_pretrained(model)
    failed = 0
    for label, text in sample_texts.items():
        expected = reference(text)["input_ids"]
        got = [int(t) for t in run(tool, model, text).split()]
        decoded = run(tool, model, " ".join(map(str, got)), "--decode")
        expected_text = reference.decode(expected)
        same_ids = got == expected
        same_text = decoded == expected_text
        plain = run(tool, model, text, "--no-special")  # no BOS/EOS: the text alone
        back = run(tool, model, plain, "--decode")
        # Must come back exactly wherever transformers' own round trip does (SentencePiece's drops
        # a leading space; a prefix space adds one).
        exact = back == text if reference.decode(
            reference(text, add_special_tokens=False)["input_ids"]) == text else None
        ok = same_ids and same_text and exact is not False
        print(f"{name:28s} {label:16s} {len(got):5d} ids  identical: {'yes' if same_ids else 'no'}"
              f"  decode: {'yes' if same_text else 'no'}  round trip: "
              f"{'yes' if exact else 'no' if exact is False else 'n/a (not in transformers)'}")
        if not ok:
            failed += 1
            first = next((i for i, (x, y) in enumerate(zip(got, expected)) if x != y),
                         min(len(got), len(expected)))
            print(f"  first difference at {first}: kvo {got[first:first + 8]} "
                  f"transformers {expected[first:first + 8]}\n  decoded {decoded[:200]!r}\n"
                  f"  expected {expected_text[:200]!r}")
    return failed


def bpe_variants(smol, work):
    """SmolLM2's vocabulary and merges under the other pipelines a tokenizer.json may describe."""
    with open(os.path.join(smol, "tokenizer.json"), encoding="utf-8") as f:
        base = json.load(f)
    with open(os.path.join(smol, "tokenizer_config.json"), encoding="utf-8") as f:
        config = json.load(f)
    llama3_regex = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?"
                    r"[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
    qwen2_regex = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?"
                   r"[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                  "use_regex": False}
    variants = {}

    llama3 = copy.deepcopy(base)
    llama3["model"]["ignore_merges"] = True
    llama3["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": llama3_regex}, "behavior": "Isolated",
         "invert": False}, byte_level]}
    llama3["post_processor"] = {"type": "Sequence", "processors": [
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        {"type": "TemplateProcessing",
         "single": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}},
                    {"Sequence": {"id": "A", "type_id": 0}}],
         "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
         "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [0],
                                              "tokens": ["<|endoftext|>"]}}}]}
    variants["llama3-style"] = (llama3, config)

    qwen2 = copy.deepcopy(base)
    qwen2["normalizer"] = {"type": "NFC"}
    qwen2["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": qwen2_regex}, "behavior": "Isolated",
         "invert": False}, byte_level]}
    variants["qwen2-style (NFC)"] = (qwen2, config)

    digits = copy.deepcopy(base)
    digits["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "Split", "pattern": {"String": "\n"}, "behavior": "MergedWithPrevious",
         "invert": False},
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}]}
    variants["digits, prefix space"] = (digits, config)

    bos_eos = copy.deepcopy(config)
    bos_eos.update({"add_bos_token": True, "add_eos_token": True})
    variants["add_bos/eos_token"] = (base, bos_eos)

    dirs = {}
    for name, (tokenizer, tokenizer_config) in variants.items():
        d = os.path.join(work, name.split()[0])
        os.makedirs(d)
        with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(tokenizer, f, ensure_ascii=False)
        with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(tokenizer_config, f)
        dirs[name] = d
    return dirs


def sentencepiece_model(work, training_text):
    import sentencepiece as spm

    d = os.path.join(work, "spm")
    os.makedirs(d)
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(training_text.splitlines()), model_prefix=os.path.join(d, "tokenizer"),
        vocab_size=800, model_type="bpe", byte_fallback=True, normalization_rule_name="identity",
        remove_extra_whitespaces=False, split_digits=True, allow_whitespace_only_pieces=True,
        add_dummy_prefix=True, character_coverage=0.9995, minloglevel=2)
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "LlamaTokenizer", "add_bos_token": True,
                   "add_eos_token": False, "bos_token": "<s>", "eos_token": "</s>",
                   "unk_token": "<unk>"}, f)
    return d


def finish(writer):
    """Writes a GGUFWriter's file out and closes it."""
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def gguf_variants(gguf_path, work):
    """SmolLM2's GGUF tokenizer copied into new GGUF files: naming Llama 3's and Qwen2's
    pre-tokenizers, and with every token in plain UTF-8 instead of the byte alphabet."""
    import gguf

    reader = gguf.GGUFReader(gguf_path)
    fields = {k: f.contents() for k, f in reader.fields.items() if k.startswith("tokenizer.")}
    byte_of = {}
    n = 0
    for b in range(256):  # GPT-2's byte alphabet, to undo it
        printable = 33 <= b <= 126 or 161 <= b <= 172 or b >= 174
        byte_of[chr(b) if printable else chr(256 + n)] = b
        n += 0 if printable else 1

    def plain(token):
        """The token in plain UTF-8 where that is unambiguous: where the plain text has a
        character outside the byte alphabet (a space, CJK), so that a reader must respell it;
        "é" stays "Ã©", since "é" is itself the alphabet's letter for byte 0xE9."""
        data = bytes(byte_of[c] for c in token) if all(c in byte_of for c in token) else None
        try:
            text = data.decode("utf-8") if data is not None else token
        except UnicodeDecodeError:
            return token  # not whole UTF-8: stays in the byte alphabet
        return text if any(c not in byte_of for c in text) else token

    variants = {}
    for name, pre, respell in (("GGUF, llama-bpe pre", "llama-bpe", False),
                               ("GGUF, qwen2 pre", "qwen2", False),
                               ("GGUF, plain-UTF-8 tokens", None, True)):
        folder = os.path.join(work, name.replace(" ", "-").replace(",", ""))
        os.makedirs(folder)
        path = os.path.join(folder, "model.gguf")
        w = gguf.GGUFWriter(path, "llama")
        tokens = [plain(t) for t in fields["tokenizer.ggml.tokens"]] if respell else \
            fields["tokenizer.ggml.tokens"]
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(pre or fields["tokenizer.ggml.pre"])
        w.add_token_list(tokens)
        w.add_token_types(fields["tokenizer.ggml.token_type"])
        w.add_token_merges(fields["tokenizer.ggml.merges"])  # in the byte alphabet, as always
        w.add_bos_token_id(fields["tokenizer.ggml.bos_token_id"])
        w.add_eos_token_id(fields["tokenizer.ggml.eos_token_id"])
        finish(w)
        variants[name] = path
    return variants


def sentencepiece_ggufs(spm_dir, work):
    """The SentencePiece model trained here written as GGUF files' "llama" vocabularies (tokens,
    scores, types, BOS/EOS/unknown ids, as llama.cpp's converter writes a tokenizer.model): under
    a Llama architecture (transformers builds a LlamaTokenizer from it) and a Phi-3 one (a space
    in front of every stretch between special tokens)."""
    import gguf
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    with open(os.path.join(spm_dir, "tokenizer.model"), "rb") as f:
        proto.ParseFromString(f.read())
    files = {}
    for name, arch in (("GGUF SentencePiece, llama", "llama"), ("GGUF SentencePiece, phi3", "phi3")):
        folder = os.path.join(work, name.replace(" ", "-").replace(",", ""))
        os.makedirs(folder)
        path = os.path.join(folder, "model.gguf")
        w = gguf.GGUFWriter(path, arch)
        w.add_tokenizer_model("llama")
        w.add_token_list([p.piece for p in proto.pieces])
        w.add_token_scores([p.score for p in proto.pieces])
        w.add_token_types([p.type for p in proto.pieces])
        w.add_bos_token_id(proto.trainer_spec.bos_id)
        w.add_eos_token_id(proto.trainer_spec.eos_id)
        w.add_unk_token_id(proto.trainer_spec.unk_id)
        w.add_add_bos_token(True)
        w.add_add_eos_token(False)
        finish(w)
        files[name] = path
    return files


def compare_gguf(tool, path, name, sample_texts):
    reference = AutoTokenizer.from_pretrained(os.path.dirname(path),
                                              gguf_file=os.path.basename(path))
    return compare(tool, path, name, sample_texts, reference)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--kvo-tokenize", required=True)
    p.add_argument("--gguf", action="store_true")
    args = p.parse_args()
    failed = 0
    with tempfile.TemporaryDirectory() as work:
        smol_texts = texts(("<|im_start|>", "<|im_end|>", "<|endoftext|>"))
        if args.gguf:
            gguf_path = os.path.join(args.model, "model.gguf")
            if not os.path.isfile(gguf_path):
                sys.exit(f"no {gguf_path} (tools/smollm2.sh keeps it)")
            failed += compare_gguf(args.kvo_tokenize, gguf_path, "SmolLM2 GGUF", smol_texts)
            some = {k: smol_texts[k] for k in ("english", "special tokens", "numbers", "mixed")}
            for name, path in gguf_variants(gguf_path, work).items():
                failed += compare_gguf(args.kvo_tokenize, path, name, some)
            spm_texts = texts(("<s>", "</s>", "<unk>"))
            spm_dir = sentencepiece_model(work, open("/usr/share/common-licenses/GPL-3").read() +
                                          CHINESE + JAPANESE + ARABIC)
            for name, path in sentencepiece_ggufs(spm_dir, work).items():
                failed += compare_gguf(args.kvo_tokenize, path, name, spm_texts)
            print(f"{'all identical' if failed == 0 else f'{failed} differ'}")
            sys.exit(1 if failed else 0)
        failed += compare(args.kvo_tokenize, args.model, "SmolLM2 (byte-level BPE)", smol_texts)
        for name, d in bpe_variants(args.model, work).items():
            failed += compare(args.kvo_tokenize, d, name, smol_texts)

        spm_texts = texts(("<s>", "</s>", "<unk>"))
        spm_dir = sentencepiece_model(work, open("/usr/share/common-licenses/GPL-3").read() +
                                      CHINESE + JAPANESE + ARABIC)
        failed += compare(args.kvo_tokenize, spm_dir, "SentencePiece (trained here)", spm_texts)
    print(f"{'all identical' if failed == 0 else f'{failed} differ'}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
