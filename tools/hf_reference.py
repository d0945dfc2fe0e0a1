#!/usr/bin/env python3
"""Reference logits from Hugging Face transformers for kvoffload's model tests.

For each architecture (a Llama 3.1 config with llama3 rope scaling, a Mistral config with a
sliding window, a Qwen2 config with q/k/v biases) this builds a small model with random weights,
writes it with save_pretrained (config.json + model.safetensors) and runs it on the CPU in
float32 over a fixed prompt. reference.safetensors holds the prompt ("input_ids", as float32)
and the logits of every position ("logits" [tokens][vocab]).

usage: hf_reference.py --out DIR [--arch llama31 mistral qwen2]
"""
import argparse
import os

import torch
from safetensors.torch import save_file
from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM,
                          Qwen2Config, Qwen2ForCausalLM)

SHAPE = dict(vocab_size=512, hidden_size=64, intermediate_size=160, num_hidden_layers=3,
             num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5,
             max_position_embeddings=4096, hidden_act="silu")
PROMPT_LEN = 24


def build(arch):
    if arch == "llama31":
        config = LlamaConfig(**SHAPE, tie_word_embeddings=False, rope_theta=500000.0,
                             rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                           "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                           "original_max_position_embeddings": 64})
        return LlamaForCausalLM, config
    if arch == "mistral":
        config = MistralConfig(**SHAPE, tie_word_embeddings=False, rope_theta=1000000.0,
                               sliding_window=10)
        return MistralForCausalLM, config
    if arch == "qwen2":
        config = Qwen2Config(**SHAPE, tie_word_embeddings=True, rope_theta=1000000.0,
                             use_sliding_window=False)
        return Qwen2ForCausalLM, config
    raise SystemExit(f"unknown arch {arch}")


def randomize(model, generator):
    # Larger than the default init, so that every layer changes the logits visibly.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=generator))
            elif p.dim() == 1:
                p.copy_(0.1 * torch.randn(p.shape, generator=generator))
            else:
                p.copy_(torch.randn(p.shape, generator=generator) / p.shape[1] ** 0.5)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--arch", nargs="*", default=["llama31", "mistral", "qwen2"])
    args = parser.parse_args()
    torch.set_num_threads(1)
    for index, arch in enumerate(args.arch):
        cls, config = build(arch)
        config.attn_implementation = "eager"
        generator = torch.Generator().manual_seed(1234 + index)
        model = cls(config).to(torch.float32).eval()
        randomize(model, generator)
        out = os.path.join(args.out, arch)
        os.makedirs(out, exist_ok=True)
        model.save_pretrained(out, safe_serialization=True)
        ids = torch.randint(0, SHAPE["vocab_size"], (1, PROMPT_LEN), generator=generator)
        with torch.no_grad():
            logits = model(input_ids=ids, use_cache=False).logits[0].float().contiguous()
        save_file({"input_ids": ids[0].float().contiguous(), "logits": logits},
                  os.path.join(out, "reference.safetensors"))
        print(f"{arch}: wrote {out} (logits {tuple(logits.shape)})")


if __name__ == "__main__":
    main()
