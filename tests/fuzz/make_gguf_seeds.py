"""Writes the seed corpus of the whole-model GGUF fuzz targets (fuzz_gguf_config,
fuzz_gguf_tokenizer, fuzz_gguf_weights), as the gguf package writes files: tiny models the decoder
serves, with the metadata llama.cpp's converter writes, a tokenizer inside and every tensor a
layer needs.

- llama, byte-level BPE (the vocabulary and merges of tests/tools/data/tokenizer.json, its
  special token a control token), matrices in Q8_0, Q4_0 and Q4_1, the embedding in F16, an
  output matrix, rope scaling llama3;
- qwen2, the same vocabulary, q/k/v biases, tied embeddings (no output matrix), BF16 and Q8_0;
- llama, a SentencePiece vocabulary (<unk>, <s>, </s>, the 256 byte pieces, a few merged
  pieces with scores), F32, F16 and Q8_0.

Run once; the outputs are kept in tests/fuzz/corpus/gguf_models/ and only change when this
script does.

    python make_gguf_seeds.py tests/tools/data/tokenizer.json tests/fuzz/corpus/gguf_models
"""
import hashlib
import json
import os
import sys
import tempfile

import gguf
import numpy as np

HIDDEN, HEADS, KV_HEADS, FF, LAYERS = 32, 4, 2, 64, 2
HEAD_DIM = HIDDEN // HEADS
Q = gguf.GGMLQuantizationType


def tensor(writer, rng, name, shape, qtype):
    data = (rng.standard_normal(shape) * 0.1).astype(np.float32)
    if qtype == Q.F32:
        writer.add_tensor(name, data)
    elif qtype == Q.F16:
        writer.add_tensor(name, data.astype(np.float16))
    else:
        writer.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)


def header(writer, arch):
    writer.add_block_count(LAYERS)
    writer.add_context_length(256)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FF)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(500000.0 if arch == "llama" else 1000000.0)
    if arch == "llama":
        writer.add_rope_dimension_count(HEAD_DIM)


def layers(writer, rng, vocab, matrix_types, biases, output_type, embed_type):
    tensor(writer, rng, "token_embd.weight", (vocab, HIDDEN), embed_type)
    if output_type is not None:
        tensor(writer, rng, "output.weight", (vocab, HIDDEN), output_type)
    tensor(writer, rng, "output_norm.weight", (HIDDEN,), Q.F32)
    shapes = {"attn_q": (HEADS * HEAD_DIM, HIDDEN), "attn_k": (KV_HEADS * HEAD_DIM, HIDDEN),
              "attn_v": (KV_HEADS * HEAD_DIM, HIDDEN), "attn_output": (HIDDEN, HEADS * HEAD_DIM),
              "ffn_gate": (FF, HIDDEN), "ffn_up": (FF, HIDDEN), "ffn_down": (HIDDEN, FF)}
    for layer in range(LAYERS):
        for i, (name, shape) in enumerate(shapes.items()):
            tensor(writer, rng, f"blk.{layer}.{name}.weight", shape,
                   matrix_types[i % len(matrix_types)])
        if biases:
            for name in ("attn_q", "attn_k", "attn_v"):
                tensor(writer, rng, f"blk.{layer}.{name}.bias", (shapes[name][0],), Q.F32)
        tensor(writer, rng, f"blk.{layer}.attn_norm.weight", (HIDDEN,), Q.F32)
        tensor(writer, rng, f"blk.{layer}.ffn_norm.weight", (HIDDEN,), Q.F32)


def bpe_vocabulary(writer, tokenizer_json):
    with open(tokenizer_json) as f:
        t = json.load(f)
    vocab = sorted(t["model"]["vocab"].items(), key=lambda kv: kv[1])
    tokens = [token for token, _ in vocab]
    types = [1] * len(tokens)
    for added in t.get("added_tokens", []):
        assert added["id"] == len(tokens)
        tokens.append(added["content"])
        types.append(3)  # control
    merges = [m if isinstance(m, str) else " ".join(m) for m in t["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("llama-bpe")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_eos_token_id(len(tokens) - 1)
    return len(tokens)


def spm_vocabulary(writer):
    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    words = ["\u2581", "a", "b", "c", "\u2581a", "\u2581b", "ab", "\u2581ab", "the", "\u2581the"]
    pieces += words
    scores = [0.0] * (3 + 256) + [-float(i) for i in range(len(words))]
    types = [2, 3, 3] + [6] * 256 + [1] * len(words)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(pieces)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(True)
    return len(pieces)


def write(out, name, arch, fill):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, name)
        writer = gguf.GGUFWriter(path, arch)
        fill(writer)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        with open(path, "rb") as f:
            data = f.read()
    with open(os.path.join(out, hashlib.sha1(data).hexdigest()), "wb") as f:
        f.write(data)
    print(f"{name}: {len(data)} bytes")


def main():
    tokenizer_json, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)

    def llama_bpe(w):
        rng = np.random.default_rng(1)
        header(w, "llama")
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(4.0)
        w.add_rope_scaling_orig_ctx_len(64)
        vocab = bpe_vocabulary(w, tokenizer_json)
        layers(w, rng, vocab, [Q.Q8_0, Q.Q4_0, Q.Q4_1], False, Q.Q8_0, Q.F16)

    def qwen2_bpe(w):
        rng = np.random.default_rng(2)
        header(w, "qwen2")
        vocab = bpe_vocabulary(w, tokenizer_json)
        layers(w, rng, vocab, [Q.BF16, Q.Q8_0], True, None, Q.Q8_0)

    def llama_spm(w):
        rng = np.random.default_rng(3)
        header(w, "llama")
        vocab = spm_vocabulary(w)
        layers(w, rng, vocab, [Q.Q8_0, Q.F32], False, Q.F16, Q.Q8_0)

    write(out, "llama_bpe.gguf", "llama", llama_bpe)
    write(out, "qwen2_bpe.gguf", "qwen2", qwen2_bpe)
    write(out, "llama_spm.gguf", "llama", llama_spm)


if __name__ == "__main__":
    main()
