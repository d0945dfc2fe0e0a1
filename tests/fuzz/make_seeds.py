"""Writes the seed corpora of the fuzz targets from real files: safetensors files, indexes and
configs as transformers and the safetensors library write them (tiny random models of the three
supported architectures, one sharded), SmolLM2-135M-Instruct's config.json, kvo-make-model's
output, token ids of real text, and sizes as users type them. Run once; the outputs are kept in
tests/fuzz/corpus/ and only change when this script does.

    python make_seeds.py --smollm2 DIR --make-model build/tools/kvo-make-model --out corpus
"""
import argparse
import hashlib
import os
import shutil
import subprocess
import tempfile

import torch
from transformers import (AutoTokenizer, LlamaConfig, LlamaForCausalLM, MistralConfig,
                          MistralForCausalLM, Phi3Config, Phi3ForCausalLM, Qwen2Config,
                          Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)


def put(out, target, data):
    """Stores `data` under its content hash, as libFuzzer names corpus files."""
    folder = os.path.join(out, target)
    os.makedirs(folder, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(folder, hashlib.sha1(data).hexdigest()), "wb") as f:
        f.write(data)


def put_file(out, target, path):
    with open(path, "rb") as f:
        put(out, target, f.read())


def tiny_models():
    common = dict(vocab_size=64, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    yield "llama", LlamaForCausalLM(LlamaConfig(
        **common, tie_word_embeddings=True,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64}))
    yield "qwen2", Qwen2ForCausalLM(Qwen2Config(**common))
    yield "mistral", MistralForCausalLM(MistralConfig(**common, sliding_window=32))
    # The other rope scalings and families (last, so that the seeds above stay as they were).
    yield "llama-linear", LlamaForCausalLM(LlamaConfig(
        **common, rope_scaling={"rope_type": "linear", "factor": 4.0}))
    yield "llama-dynamic", LlamaForCausalLM(LlamaConfig(
        **common, rope_scaling={"rope_type": "dynamic", "factor": 2.0}))
    yield "qwen3-yarn", Qwen3ForCausalLM(Qwen3Config(
        **common, head_dim=8, rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                            "original_max_position_embeddings": 32}))
    yield "phi3-longrope", Phi3ForCausalLM(Phi3Config(
        **common, original_max_position_embeddings=32, pad_token_id=0, eos_token_id=1,
        rope_scaling={"rope_type": "longrope", "short_factor": [1.0, 1.1],
                      "long_factor": [1.0, 3.0]}))


def gguf_seeds(out):
    """Small GGUF files as the gguf package writes them: metadata of every value type and a
    tokenizer's arrays, tensors of the block types the decoder serves, two alignments."""
    import gguf
    import numpy as np

    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        for i, (alignment, types) in enumerate(((None, ["F32", "F16", "Q8_0", "Q4_1"]),
                                                 (64, ["BF16", "Q4_0", "Q4_K", "Q5_K", "Q6_K"]))):
            path = os.path.join(tmp, f"seed{i}.gguf")
            w = gguf.GGUFWriter(path, "llama")
            if alignment:
                w.add_custom_alignment(alignment)
            w.add_block_count(2)
            w.add_context_length(4096)
            w.add_rope_freq_base(10000.0)
            w.add_bool("seed.flag", True)
            w.add_int64("seed.i64", -5)
            w.add_float64("seed.f64", 0.5)
            w.add_tokenizer_model("gpt2")
            w.add_token_list([f"t{j}" for j in range(12)])
            w.add_token_scores([float(j) for j in range(12)])
            w.add_token_types([1] * 12)
            w.add_token_merges(["t 1", "t 2"])
            for name in types:
                kind = gguf.GGMLQuantizationType[name]
                block, block_bytes = gguf.GGML_QUANT_SIZES[kind]
                raw = rng.integers(0, 256, (2, 256 // block * block_bytes), dtype=np.uint8)
                w.add_tensor(f"blk.0.{name.lower()}.weight", raw, raw_dtype=kind)
            w.write_header_to_file()
            w.write_kv_data_to_file()
            w.write_tensors_to_file()
            w.close()
            put_file(out, "fuzz_gguf", path)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--smollm2", required=True)
    p.add_argument("--make-model", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    gguf_seeds(args.out)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        for name, model in tiny_models():
            for dtype in (torch.float32, torch.bfloat16):
                d = os.path.join(tmp, f"{name}-{dtype}")
                model.to(dtype).save_pretrained(d)
                put_file(args.out, "fuzz_safetensors_header", os.path.join(d, "model.safetensors"))
                put_file(args.out, "fuzz_config_json", os.path.join(d, "config.json"))
            d = os.path.join(tmp, f"{name}-sharded")
            model.to(torch.float32).save_pretrained(d, max_shard_size="4KB")
            put_file(args.out, "fuzz_safetensors_index",
                     os.path.join(d, "model.safetensors.index.json"))
        # kvo-make-model's own files: one model whole, one in shards.
        for extra in ([], ["--shards", "3"]):
            d = os.path.join(tmp, "made" + "".join(extra))
            subprocess.run([args.make_model, "--out", d, "--arch", "qwen2", "--layers", "2",
                            "--hidden", "16", "--intermediate", "24", "--heads", "4",
                            "--kv-heads", "2", "--head-dim", "4", "--vocab", "64",
                            "--dtype", "f16"] + extra, check=True, stdout=subprocess.DEVNULL)
            put_file(args.out, "fuzz_config_json", os.path.join(d, "config.json"))
            for f in sorted(os.listdir(d)):
                if f.endswith(".safetensors"):
                    put_file(args.out, "fuzz_safetensors_header", os.path.join(d, f))
                if f.endswith(".index.json"):
                    put_file(args.out, "fuzz_safetensors_index", os.path.join(d, f))
    put_file(args.out, "fuzz_config_json", os.path.join(args.smollm2, "config.json"))

    tokenizer = AutoTokenizer.from_pretrained(args.smollm2)
    text = ("The cache keeps the full-length keys and values in pinned host memory and streams "
            "each layer's valid prefix to the device just before it is needed.")
    ids = tokenizer(text)["input_ids"]
    put(args.out, "fuzz_token_file", " ".join(map(str, ids)) + "\n")
    put(args.out, "fuzz_token_file", ",".join(map(str, ids)) + "\n")
    put(args.out, "fuzz_token_file", "\r\n".join(", ".join(map(str, ids[i:i + 7]))
                                                 for i in range(0, len(ids), 7)) + "\r\n")
    put(args.out, "fuzz_token_file", "0 2147483647\n\n\t1\t2  3\n")

    for size in ["24GiB", "512MiB", "1.5GB", "4096", "80 GB", "2TiB", "0.5KiB", "1000000KB",
                 "128k", "4K", "1m", "1g", "1024m", "0.7", "1e-3", "-1", "010", "18446744073709551615"]:
        put(args.out, "fuzz_size_string", size)


if __name__ == "__main__":
    main()
