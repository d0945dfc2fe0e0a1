"""Tiny randomly initialised decoder models for the kvoffload.hf tests, built from configs (no
download), and the byte arithmetic the tests compare the native cache against.

The weights are drawn with a large initializer_range so that greedy decoding does not collapse
into one repeated token: a wrong key or value row then changes the generated tokens.
"""

import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

VOCAB = 128
PAD = 0

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


def llama3_config(**overrides):
    """Llama with llama3 rope scaling (the frequency bands of Llama 3.1)."""
    rope = dict(
        rope_type="llama3",
        rope_theta=500000.0,
        factor=8.0,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=16,  # short, so the scaled bands matter here
    )
    return LlamaConfig(**{**_COMMON, "rope_parameters": rope, **overrides})


def mistral_config(**overrides):
    """Mistral as configured by default: sliding_window=4096, longer than any cache here."""
    return MistralConfig(**{**_COMMON, **overrides})


def qwen2_config(**overrides):
    """Qwen2 with attention biases on q/k/v, full attention on every layer."""
    return Qwen2Config(**{**_COMMON, **overrides})


_MODELS = {
    "llama3": (llama3_config, LlamaForCausalLM),
    "mistral": (mistral_config, MistralForCausalLM),
    "qwen2": (qwen2_config, Qwen2ForCausalLM),
}
MODEL_NAMES = tuple(_MODELS)


def make_model(name, seed=0, **overrides):
    make_config, model_class = _MODELS[name]
    torch.manual_seed(seed)
    return model_class(make_config(**overrides)).eval()


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
