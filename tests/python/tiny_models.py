"""Tiny randomly initialised decoder models for the kvoffload.hf tests, built from configs (no
download), and the byte arithmetic the tests compare the native cache against.

The weights are drawn with a large initializer_range so that greedy decoding does not collapse
into one repeated token: a wrong key or value row then changes the generated tokens.

``ARCHITECTURES`` holds one tiny config per kind of cache layer transformers 5.x has: full
attention (Llama 3, Mistral with a long window, Qwen2, Falcon's and GPT-BigCode's multi-query
layouts, Falcon-40B's new decoder architecture), sliding and
chunked windows shorter than the tests' caches (Gemma 2 and 3, Cohere2, GPT-OSS, Llama 4 text,
Mistral, Qwen2 and Starcoder2), and fixed-size states (Qwen3-Next's gated delta net, Jamba's
Mamba, Bamba's and Falcon-H1's Mamba-2, LFM2's short convolution, MiniMax's lightning attention).
Every model has 4 layers and, where its family mixes kinds, two full-attention layers, so that one
can be resident while the other is streamed. Windows are 8 tokens: the tests' prompts cross them.
"""

import os
import sysconfig

import torch
import transformers as tf
from transformers import AutoModelForCausalLM

import kvoffload

# Under ctest the tests run against the wheel installed into an environment
# (tools/python-wheel.sh), never the build tree: KVO_EXPECT_INSTALLED_PACKAGE says so.
if os.environ.get("KVO_EXPECT_INSTALLED_PACKAGE"):
    _site = os.path.realpath(sysconfig.get_paths()["purelib"])
    if not os.path.realpath(kvoffload.__file__).startswith(_site + os.sep):
        raise ImportError(f"kvoffload was imported from {kvoffload.__file__}, not from the "
                          f"environment's installed package ({_site})")

VOCAB = 128
PAD = 0
WINDOW = 8

_COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,  # grouped-query attention, as in the real models
    max_position_embeddings=256,
    pad_token_id=PAD,
    bos_token_id=1,
    eos_token_id=None,  # never stop early: every run generates max_new_tokens
    initializer_range=0.2,
)
_ALTERNATING = ["sliding_attention", "full_attention"] * 2
_LLAMA3_ROPE = dict(
    rope_type="llama3",
    rope_theta=500000.0,
    factor=8.0,
    low_freq_factor=1.0,
    high_freq_factor=4.0,
    original_max_position_embeddings=16,  # short, so the scaled bands matter here
)
_MAMBA2 = dict(mamba_n_heads=4, mamba_d_head=32, mamba_n_groups=1, mamba_d_state=8)

# name -> (config class, overrides of _COMMON, keys not taken by that config)
ARCHITECTURES = {
    # full attention on every layer
    "llama3": (tf.LlamaConfig, dict(rope_parameters=_LLAMA3_ROPE), ()),
    "mistral": (tf.MistralConfig, dict(), ()),  # sliding_window=4096: never hides a token here
    "qwen2": (tf.Qwen2Config, dict(), ()),
    "falcon": (tf.FalconConfig, dict(multi_query=True), ("num_key_value_heads",)),
    "falcon_40b": (tf.FalconConfig, dict(new_decoder_architecture=True, num_kv_heads=2),
                   ("num_key_value_heads",)),
    "gpt_bigcode": (tf.GPTBigCodeConfig, dict(multi_query=True, n_embd=64, n_layer=4, n_head=4,
                                              n_positions=256),
                    ("hidden_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "max_position_embeddings", "intermediate_size")),
    # sliding or chunked windows shorter than the caches
    "gemma2": (tf.Gemma2Config, dict(sliding_window=WINDOW, head_dim=16), ()),
    "gemma3": (tf.Gemma3TextConfig, dict(sliding_window=WINDOW, head_dim=16,
                                         sliding_window_pattern=2), ()),
    "cohere2": (tf.Cohere2Config, dict(sliding_window=WINDOW, sliding_window_pattern=2), ()),
    "gpt_oss": (tf.GptOssConfig, dict(sliding_window=WINDOW, head_dim=16, num_local_experts=4,
                                      num_experts_per_tok=2), ()),
    "llama4": (tf.Llama4TextConfig, dict(attention_chunk_size=WINDOW, head_dim=16,
                                         intermediate_size_mlp=128, num_local_experts=2,
                                         no_rope_layer_interval=2), ()),
    "mistral_window": (tf.MistralConfig, dict(sliding_window=WINDOW), ()),
    "qwen2_window": (tf.Qwen2Config, dict(use_sliding_window=True, sliding_window=WINDOW,
                                          max_window_layers=2), ()),
    "starcoder2": (tf.Starcoder2Config, dict(sliding_window=WINDOW), ()),
    # fixed-size states
    "qwen3_next": (tf.Qwen3NextConfig, dict(
        head_dim=16, linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=8,
        linear_value_head_dim=8, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
        layer_types=["linear_attention", "full_attention"] * 2), ()),
    "jamba": (tf.JambaConfig, dict(num_experts=2, attn_layer_period=2, attn_layer_offset=1,
                                   expert_layer_period=2, expert_layer_offset=1, mamba_d_state=4,
                                   mamba_expand=2, mamba_dt_rank=8), ()),
    "bamba": (tf.BambaConfig, dict(attn_layer_indices=[1, 3], **_MAMBA2), ()),
    "falcon_h1": (tf.FalconH1Config, dict(head_dim=16, mamba_d_ssm=128, **_MAMBA2), ()),
    "lfm2": (tf.Lfm2Config, dict(layer_types=["conv", "full_attention"] * 2, block_ff_dim=128,
                                 conv_L_cache=3), ()),
    "minimax": (tf.MiniMaxConfig, dict(layer_types=["linear_attention", "full_attention"] * 2,
                                       head_dim=16, num_local_experts=2, block_size=4), ()),
}
MODEL_NAMES = ("llama3", "mistral", "qwen2")  # plain full attention, the drop-in's first models
WINDOWED = ("gemma2", "gemma3", "cohere2", "gpt_oss", "llama4", "mistral_window", "qwen2_window",
            "starcoder2")
STATEFUL = ("qwen3_next", "jamba", "bamba", "falcon_h1", "lfm2", "minimax")

# Models transformers' StaticCache cannot run (the reference is then their own default cache).
NO_STATIC_CACHE = ("minimax",)

# Multi-head latent attention, as transformers caches it: keys are the kv_lora_rank-wide latent,
# values the qk_rope_head_dim-wide rope key, one head (keys and values of different head sizes).
MLA = {
    "deepseek_v2": (tf.DeepseekV2Config, dict(num_key_value_heads=4, kv_lora_rank=32, q_lora_rank=None,
                                              qk_nope_head_dim=16, qk_rope_head_dim=8,
                                              v_head_dim=16, n_routed_experts=2,
                                              num_experts_per_tok=1, moe_intermediate_size=32,
                                              first_k_dense_replace=1), ()),
    "deepseek_v3": (tf.DeepseekV3Config, dict(num_key_value_heads=4, kv_lora_rank=32, q_lora_rank=16,
                                              qk_nope_head_dim=16, qk_rope_head_dim=8,
                                              v_head_dim=16, n_routed_experts=2,
                                              num_experts_per_tok=1, moe_intermediate_size=32,
                                              first_k_dense_replace=1, n_group=1,
                                              topk_group=1), ()),
}


def make_config(name, **overrides):
    config_class, own, dropped = {**ARCHITECTURES, **MLA}[name]
    kwargs = {**_COMMON, **own, **overrides}
    for key in dropped:
        kwargs.pop(key)
    return config_class(**kwargs)


def llama3_config(**overrides):
    """Llama with llama3 rope scaling (the frequency bands of Llama 3.1)."""
    return make_config("llama3", **overrides)


def mistral_config(**overrides):
    """Mistral as configured by default: sliding_window=4096, longer than any cache here."""
    return make_config("mistral", **overrides)


def qwen2_config(**overrides):
    """Qwen2 with attention biases on q/k/v, full attention on every layer."""
    return make_config("qwen2", **overrides)


def make_model(name, seed=0, **overrides):
    config = make_config(name, **overrides)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config).eval()


def prompts(batch, length, seed, pad_rows=()):
    """(input_ids, attention_mask) of `batch` rows, left-padded by the given counts per row."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, VOCAB, (batch, length), generator=generator)
    mask = torch.ones_like(ids)
    for row, pad in enumerate(pad_rows):
        mask[row, :pad] = 0
    ids[mask == 0] = PAD
    return ids, mask


def round_up(value, alignment=256):
    return (value + alignment - 1) // alignment * alignment


def expected_plan(config, slots, max_cache_len, element_size, resident, ring_depth):
    """The bytes kvoffload/plan.hpp documents, computed here independently: each tensor (K or V
    of one layer) is slots * max_cache_len rows, 256-aligned; the device holds the resident layers
    and ring_depth staging buffers (one layer each), the host the streamed layers."""
    layers = config.num_hidden_layers
    head_dim = config.hidden_size // config.num_attention_heads
    row = config.num_key_value_heads * head_dim * element_size
    layer_bytes = 2 * round_up(slots * max_cache_len * row)
    streamed = layers - resident
    ring = ring_depth if streamed > 0 else 0
    return {
        "row_bytes": row,
        "layer_bytes": layer_bytes,
        "resident_layers": resident,
        "streamed_layers": streamed,
        "ring_depth": ring,
        "device_bytes": (resident + ring) * layer_bytes,
        "host_bytes": streamed * layer_bytes,
    }
