#!/usr/bin/env python3
"""Reference logits from Hugging Face transformers for kvoffload's model tests.

For each architecture (a Llama 3.1 config with llama3 rope scaling, a Mistral config with a
sliding window, a Qwen2 config with q/k/v biases, a Qwen3 config with its q and k norms, yarn
and head_dim * heads twice hidden_size, Gemma 2 and Gemma 3 configs with windows shorter than the
prompt, a Granite config with its four scales, an OLMo 2 config, and one config for each other rope scaling: linear, dynamic, yarn, longrope, each with a
pretraining length shorter than the prompt) this
builds a small model with random weights, writes it with save_pretrained (config.json +
model.safetensors) and runs it on the CPU in float32 over a fixed prompt, as generation runs it:
the first PREFILL tokens in one forward, then one token a forward over the cache (the tables of
dynamic and longrope follow the forwards). reference.safetensors holds the prompt ("input_ids",
as float32) and the logits of every position ("logits" [tokens][vocab]); rope.safetensors the
rope table transformers computes for a forward of each length in "lengths" ("inv_freq"
[lengths][head_dim / 2], "scale" [lengths]).

The gguf_* cases (one per GGUF block type, and Qwen2 twice) write a random model as a GGUF file
(model.gguf) as llama.cpp's converter lays it out, load it with transformers' GGUF loader, and
save what that loader read (config.json + model.safetensors) with the logits of that model.

The made_* cases (with --kvo-make-model) go the other way: kvo-make-model writes a random
checkpoint of a family (its config.json as kvoffload writes it), and transformers reads those
files and gives the logits, so that a config we write means to transformers what it means to us.

usage: hf_reference.py --out DIR [--arch NAME...] [--kvo-make-model PATH]
"""
import subprocess
import argparse
import os

import torch
from safetensors.torch import save_file
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers import (Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig,
                          GraniteConfig, GraniteForCausalLM, LlamaConfig, LlamaForCausalLM,
                          MistralConfig, MistralForCausalLM, Olmo2Config, Olmo2ForCausalLM,
                          Phi3Config, Phi3ForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config,
                          Qwen3ForCausalLM)

SHAPE = dict(vocab_size=512, hidden_size=64, intermediate_size=160, num_hidden_layers=3,
             num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5,
             max_position_embeddings=4096, hidden_act="silu")
PROMPT_LEN = 24
PREFILL = 8  # tests/model/hf_reference_test.cpp prefills as many, then decodes one at a time
ARCHS = ["llama31", "mistral", "qwen2", "llama_linear", "llama_dynamic", "qwen2_yarn",
         "llama_longrope", "qwen3", "phi3", "gemma2", "gemma3", "granite", "olmo2"]


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
    # The other rope scalings, each reaching past its pretraining length (16) within the prompt.
    if arch == "llama_linear":
        return LlamaForCausalLM, LlamaConfig(**SHAPE, rope_theta=10000.0,
                                             rope_scaling={"rope_type": "linear", "factor": 4.0})
    if arch == "llama_dynamic":
        shape = dict(SHAPE, max_position_embeddings=16)
        return LlamaForCausalLM, LlamaConfig(**shape, rope_theta=10000.0,
                                             rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    if arch == "qwen2_yarn":
        config = Qwen2Config(**dict(SHAPE, max_position_embeddings=64), tie_word_embeddings=True, rope_theta=1000000.0,
                             use_sliding_window=False,
                             rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                           "original_max_position_embeddings": 16})
        return Qwen2ForCausalLM, config
    if arch == "llama_longrope":
        half = SHAPE["head_dim"] // 2
        shape = dict(SHAPE, max_position_embeddings=64)
        short = [1.0 + 0.05 * i for i in range(half)]
        long = [1.0 + 0.6 * i for i in range(half)]
        return LlamaForCausalLM, LlamaConfig(
            **shape, rope_theta=10000.0,
            rope_scaling={"rope_type": "longrope", "short_factor": short, "long_factor": long,
                          "original_max_position_embeddings": 16})
    # Qwen3 as its long-context checkpoints are served: yarn, and heads * head_dim (128) twice
    # hidden_size.
    if arch == "qwen3":
        shape = dict(SHAPE, head_dim=32, max_position_embeddings=64)
        config = Qwen3Config(**shape, tie_word_embeddings=True, rope_theta=1000000.0,
                             use_sliding_window=False,
                             rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                           "original_max_position_embeddings": 16})
        return Qwen3ForCausalLM, config
    # Phi-3 as its 128K models are configured: fused projections, longrope with the pretraining
    # length at the top level, and a window.
    if arch == "phi3":
        half = SHAPE["head_dim"] // 2
        shape = dict(SHAPE, max_position_embeddings=64)
        config = Phi3Config(**shape, original_max_position_embeddings=16, sliding_window=12,
                            pad_token_id=0, eos_token_id=2, bos_token_id=1,
                            tie_word_embeddings=False, rope_theta=10000.0,
                            rope_scaling={"rope_type": "longrope",
                                          "short_factor": [1.0 + 0.03 * i for i in range(half)],
                                          "long_factor": [1.0 + 0.8 * i for i in range(half)]})
        return Phi3ForCausalLM, config
    # Gemma 2: windows of 6 keys on layers 0 and 2, query_pre_attn_scalar unlike head_dim, and
    # caps low enough that tanh bends the scores and the logits (the released 50 and 30 barely
    # touch a small random model's).
    if arch == "gemma2":
        shape = dict(SHAPE, hidden_act="gelu_pytorch_tanh")
        config = Gemma2Config(**shape, hidden_activation="gelu_pytorch_tanh", sliding_window=6,
                              query_pre_attn_scalar=24, attn_logit_softcapping=2.0,
                              final_logit_softcapping=4.0, rope_theta=10000.0,
                              tie_word_embeddings=True)
        return Gemma2ForCausalLM, config
    # Gemma 3: q/k norms, windows of 6 keys on all but layer 2, the window layers rotating at
    # their own base and the full layer with linear scaling.
    if arch == "gemma3":
        shape = dict(SHAPE, num_hidden_layers=4, head_dim=32, hidden_act="gelu_pytorch_tanh",
                     max_position_embeddings=64)
        config = Gemma3TextConfig(
            **shape, hidden_activation="gelu_pytorch_tanh", sliding_window=6,
            query_pre_attn_scalar=32, tie_word_embeddings=True,
            layer_types=["sliding_attention", "sliding_attention", "full_attention",
                         "sliding_attention"],
            rope_parameters={"full_attention": {"rope_type": "linear", "factor": 4.0,
                                                "rope_theta": 1000000.0},
                             "sliding_attention": {"rope_type": "default",
                                                   "rope_theta": 10000.0}})
        config.architectures = ["Gemma3ForCausalLM"]
        return Gemma3ForCausalLM, config
    # Granite: every one of its four scales away from 1 (the attention's unlike head_dim^-1/2),
    # with attention biases.
    if arch == "granite":
        shape = {k: v for k, v in SHAPE.items() if k != "head_dim"}
        config = GraniteConfig(**shape, tie_word_embeddings=True, rope_theta=10000.0,
                               attention_bias=True, embedding_multiplier=6.0,
                               residual_multiplier=0.3, attention_multiplier=0.09,
                               logits_scaling=3.0)
        return GraniteForCausalLM, config
    # OLMo 2: q and k normed over their whole projections, the branches normed after.
    if arch == "olmo2":
        shape = {k: v for k, v in SHAPE.items() if k != "head_dim"}
        config = Olmo2Config(**shape, tie_word_embeddings=False, rope_theta=500000.0)
        return Olmo2ForCausalLM, config
    raise SystemExit(f"unknown arch {arch}")


def rope_tables(model):
    """The table a forward of each length uses, as the rotary embedding computes it."""
    config = model.config
    params = config.rope_parameters
    layer_type = None
    if "full_attention" in params:  # Gemma 3: the full layers' rotation is the scaled one
        layer_type = "full_attention"
        params = params[layer_type]
    kind = params.get("rope_type", "default")
    if kind == "default":
        return None
    original = params.get("original_max_position_embeddings", config.max_position_embeddings)
    lengths = [1, 2, original, original + 1, 4 * original]
    init = ROPE_INIT_FUNCTIONS[kind]
    rows, scales = [], []
    for length in lengths:
        if kind == "dynamic":
            # A forward recomputes only past max_position_embeddings, with its length a tensor.
            seq = torch.tensor(length) if length > config.max_position_embeddings else None
        else:
            seq = length
        inv_freq, scale = init(config, None, seq_len=seq, layer_type=layer_type)
        rows.append(inv_freq.float())
        scales.append(float(scale))
    return {"lengths": torch.tensor(lengths, dtype=torch.float32),
            "inv_freq": torch.stack(rows).contiguous(),
            "scale": torch.tensor(scales, dtype=torch.float32)}


def generation_logits(model, ids):
    """Logits of every position: PREFILL tokens in one forward, then one a forward."""
    with torch.no_grad():
        out = model(input_ids=ids[:, :PREFILL], use_cache=True)
        logits = [out.logits[0]]
        cache = out.cache
        for p in range(PREFILL, ids.shape[1]):
            out = model(input_ids=ids[:, p:p + 1], cache=cache, use_cache=True)
            cache = out.cache
            logits.append(out.logits[0])
    return torch.cat(logits).float().contiguous()


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


# GGUF files of random models, one per block type (and Qwen2's biases in three of them): the
# tensors written as llama.cpp's converter writes them (names, q and k rows of a Llama interleaved
# per head, 1-D tensors in F32), the matrices in the block type; then loaded by transformers' GGUF
# loader (which dequantizes to float32 and puts the rows back), saved as safetensors beside the
# file with the logits of that model. Rows of 256 and 512: whole blocks of every type.
GGUF_SHAPE = dict(vocab_size=384, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=64, rms_norm_eps=1e-5,
                  max_position_embeddings=4096, hidden_act="silu")
GGUF_TYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K"]
GGUF_CASES = [f"gguf_llama_{t.lower()}" for t in GGUF_TYPES] + ["gguf_qwen2_q8_0",
                                                                 "gguf_qwen2_q4_k",
                                                                 "gguf_qwen2_bf16"]
GGUF_NAMES = {"input_layernorm.weight": "attn_norm.weight",
              "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
              "self_attn.v_proj.weight": "attn_v.weight", "self_attn.q_proj.bias": "attn_q.bias",
              "self_attn.k_proj.bias": "attn_k.bias", "self_attn.v_proj.bias": "attn_v.bias",
              "self_attn.o_proj.weight": "attn_output.weight",
              "post_attention_layernorm.weight": "ffn_norm.weight",
              "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
              "mlp.down_proj.weight": "ffn_down.weight"}


def gguf_name(name):
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight":
           "output_norm.weight", "lm_head.weight": "output.weight"}
    if name in top:
        return top[name]
    _, _, layer, rest = name.split(".", 3)
    return f"blk.{layer}.{GGUF_NAMES[rest]}"


def interleave(w, heads):
    """llama.cpp's converter's order for q and k of a Llama: row h * d/2 + i of a head of d rows
    goes to row 2i + h."""
    rows = w.shape[0]
    return (w.reshape(heads, 2, rows // heads // 2, *w.shape[1:]).swapaxes(1, 2)
            .reshape(w.shape))


def random_blocks(kind, rows, columns, std, rng):
    """Blocks of a k-quant type, whose reference has no quantizer: random quants and sub-block
    scales, the super-block scales set so that the elements have about `std`."""
    import gguf
    import numpy as np
    block, block_bytes = gguf.GGML_QUANT_SIZES[kind]
    raw = rng.integers(0, 256, (rows, columns // block, block_bytes), dtype=np.uint8)
    d_at = 208 if kind == gguf.GGMLQuantizationType.Q6_K else 0

    def set_scales(d, dmin):
        raw[:, :, d_at:d_at + 2] = np.array([d], dtype=np.float16).view(np.uint8)
        if kind != gguf.GGMLQuantizationType.Q6_K:  # dmin centres the unsigned quants
            raw[:, :, 2:4] = np.array([dmin], dtype=np.float16).view(np.uint8)

    levels = 8.0 if kind == gguf.GGMLQuantizationType.Q4_K else 16.0
    set_scales(1e-3, 1e-3 * levels)
    flat = raw.reshape(rows, -1)
    got = float(gguf.quants.dequantize(flat, kind).std())
    set_scales(1e-3 * std / got, 1e-3 * levels * std / got)
    return raw.reshape(rows, -1)


def write_gguf(model, arch, type_name, path, rng):
    import gguf
    import numpy as np
    config = model.config
    kind = gguf.GGMLQuantizationType[type_name]
    writer = gguf.GGUFWriter(path, arch)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    if arch == "llama":
        writer.add_rope_dimension_count(config.head_dim)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([f"t{i}" for i in range(config.vocab_size)])
    writer.add_token_types([1] * config.vocab_size)
    writer.add_token_merges(["t 1"])
    for name, p in model.state_dict().items():
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        w = p.detach().float().numpy()
        if arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = (config.num_attention_heads if "q_proj" in name
                     else config.num_key_value_heads)
            w = interleave(w, heads)
        if w.ndim == 1 or kind == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(gguf_name(name), np.ascontiguousarray(w, dtype=np.float32))
        elif type_name in ("Q4_K", "Q5_K", "Q6_K"):
            raw = random_blocks(kind, w.shape[0], w.shape[1], float(w.std()), rng)
            writer.add_tensor(gguf_name(name), raw, raw_dtype=kind)
        else:
            writer.add_tensor(gguf_name(name), gguf.quants.quantize(w, kind), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def gguf_case(case, index, out_root):
    import numpy as np
    from transformers import AutoModelForCausalLM
    _, arch, type_name = case.split("_", 2)
    type_name = type_name.upper()
    if arch == "llama":
        cls, config = LlamaForCausalLM, LlamaConfig(**GGUF_SHAPE, tie_word_embeddings=False,
                                                     rope_theta=10000.0)
    else:
        cls, config = Qwen2ForCausalLM, Qwen2Config(**GGUF_SHAPE, tie_word_embeddings=True,
                                                     rope_theta=1000000.0,
                                                     use_sliding_window=False)
    generator = torch.Generator().manual_seed(4321 + index)
    model = cls(config).to(torch.float32).eval()
    randomize(model, generator)
    out = os.path.join(out_root, case)
    os.makedirs(out, exist_ok=True)
    write_gguf(model, arch, type_name, os.path.join(out, "model.gguf"),
               np.random.default_rng(index))
    loaded = AutoModelForCausalLM.from_pretrained(out, gguf_file="model.gguf",
                                                  dtype=torch.float32).eval()
    loaded.config.attn_implementation = "eager"
    loaded.hf_quantizer = None
    if hasattr(loaded.config, "quantization_config"):
        del loaded.config.quantization_config
    loaded.save_pretrained(out, safe_serialization=True)
    ids = torch.randint(0, GGUF_SHAPE["vocab_size"], (1, PROMPT_LEN), generator=generator)
    logits = generation_logits(loaded, ids)
    save_file({"input_ids": ids[0].float().contiguous(), "logits": logits},
              os.path.join(out, "reference.safetensors"))
    print(f"{case}: wrote {out} (logits {tuple(logits.shape)})")


# kvo-make-model's arguments for each made_* case: Gemma with windows shorter than the prompt
# (Gemma 3 with six layers, so that one is full, and linear scaling on it); Granite with the
# scales kvo-make-model gives it; OLMo 2.
MADE_SHAPE = ["--preset", "tiny", "--hidden", "64", "--intermediate", "160", "--heads", "4",
              "--kv-heads", "2", "--vocab", "512", "--dtype", "f32"]
MADE_CASES = {
    "made_gemma2": ["--arch", "gemma2", "--layers", "3", "--head-dim", "16", "--window", "6"],
    "made_gemma3_text": ["--arch", "gemma3_text", "--layers", "6", "--head-dim", "32", "--rope",
                         "linear", "--rope-factor", "4", "--window", "6"],
    "made_granite": ["--arch", "granite", "--layers", "3", "--head-dim", "16"],
    "made_olmo2": ["--arch", "olmo2", "--layers", "3", "--head-dim", "16"],
}


def made_case(case, index, out_root, make_model):
    from transformers import AutoModelForCausalLM
    out = os.path.join(out_root, case)
    if os.path.isdir(out):
        import shutil
        shutil.rmtree(out)
    subprocess.run([make_model, "--out", out, "--seed", str(index)] + MADE_SHAPE + MADE_CASES[case],
                   check=True, stdout=subprocess.DEVNULL)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    generator = torch.Generator().manual_seed(1234 + index)
    write_reference(case, model, out, generator)


def write_reference(case, model, out, generator):
    """The prompt, the logits of every position and the rope tables, beside the checkpoint."""
    ids = torch.randint(0, model.config.vocab_size, (1, PROMPT_LEN), generator=generator)
    tables = rope_tables(model)  # before any forward changes the rotary embedding's state
    logits = generation_logits(model, ids)
    save_file({"input_ids": ids[0].float().contiguous(), "logits": logits},
              os.path.join(out, "reference.safetensors"))
    if tables is not None:
        save_file(tables, os.path.join(out, "rope.safetensors"))
    print(f"{case}: wrote {out} (logits {tuple(logits.shape)})")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--arch", nargs="*")
    parser.add_argument("--kvo-make-model")
    args = parser.parse_args()
    if args.arch is None:
        args.arch = ARCHS + GGUF_CASES + (list(MADE_CASES) if args.kvo_make_model else [])
    torch.set_num_threads(1)
    for index, arch in enumerate(args.arch):
        if arch.startswith("gguf_"):
            gguf_case(arch, index, args.out)
            continue
        if arch.startswith("made_"):
            made_case(arch, index, args.out, args.kvo_make_model)
            continue
        cls, config = build(arch)
        config.attn_implementation = "eager"
        generator = torch.Generator().manual_seed(1234 + index)
        model = cls(config).to(torch.float32).eval()
        randomize(model, generator)
        out = os.path.join(args.out, arch)
        os.makedirs(out, exist_ok=True)
        model.save_pretrained(out, safe_serialization=True)
        write_reference(arch, model, out, generator)


if __name__ == "__main__":
    main()
