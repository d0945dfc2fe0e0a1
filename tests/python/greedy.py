"""Greedy generate with kvoffload.hf.OffloadedStaticCache against transformers' own cache on the
same tiny model: the helpers the per-architecture tests share.

The reference is transformers' StaticCache, except for models it cannot run (MiniMax, whose
forward insists on its own MiniMaxCache). That reference is patched for one transformers bug:
MiniMaxCache answers get_seq_length and get_mask_sizes from layer 0, a linear-attention layer that
holds no keys, so during decoding its masks are built for an empty cache and left padding is
ignored (batch-1 runs are unaffected); the patched reference asks the first full-attention layer,
as transformers' other hybrid caches do.
"""

import torch
from transformers import StaticCache

from kvoffload.hf import OffloadedStaticCache
from kvoffload.hf_layers import OFFLOADED, describe_layers
from tiny_models import NO_STATIC_CACHE, make_model, prompts

MAX_CACHE_LEN = 40
NEW_TOKENS = 8


def reference_cache(model, max_cache_len=MAX_CACHE_LEN):
    if model.config.model_type not in NO_STATIC_CACHE:
        return StaticCache(config=model.config, max_cache_len=max_cache_len)
    from transformers.models.minimax.modeling_minimax import MiniMaxCache

    full = model.config.layer_types.index("full_attention")

    class FirstFullLayerMiniMaxCache(MiniMaxCache):
        def get_seq_length(self, layer_idx=0):
            return super().get_seq_length(full)

        def get_mask_sizes(self, query_length, layer_idx):
            return super().get_mask_sizes(query_length, full)

    return FirstFullLayerMiniMaxCache()


def greedy(model, cache, ids, mask, new_tokens=NEW_TOKENS, **kwargs):
    return model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False,
                          cache=cache, **kwargs)


def zero_returned_keys(cache):
    """Makes `cache` hand the model zero keys: a guard that the rows it returns are what the model
    attends to (the tokens must change)."""
    original_update = cache.update

    def zeroing_update(key_states, value_states, layer_idx, *args, **kwargs):
        keys, values = original_update(key_states, value_states, layer_idx, *args, **kwargs)
        return keys * 0, values

    cache.update = zeroing_update


def offloaded(model, batch, resident_layers=0, max_cache_len=MAX_CACHE_LEN, **kwargs):
    return OffloadedStaticCache(model.config, batch, max_cache_len, device="cpu",
                                dtype=torch.float32, resident_layers=resident_layers, **kwargs)


def make_with_attention(name, attention, **overrides):
    """The model with this attention implementation, or None when its family has no such one
    (Gemma 2 and GPT-OSS attend with eager only)."""
    try:
        model = make_model(name, attn_implementation=attention, **overrides)
    except ValueError:
        return None
    assert model.config._attn_implementation == attention
    return model


def check_architecture(test, name):
    """Greedy tokens equal the reference's for `name`: one row with every full-attention layer
    streamed (sdpa); two left-padded rows with one full-attention layer resident and the rest
    streamed (eager), then again on the same cache after reset(), on shorter prompts."""
    model = make_with_attention(name, "sdpa")
    if model is not None:
        ids, mask = prompts(1, 12, seed=1)
        cache = offloaded(model, 1, resident_layers=0)
        test.assertEqual(greedy(model, cache, ids, mask).tolist(),
                         greedy(model, reference_cache(model), ids, mask).tolist(),
                         f"{name}: one row, streamed, sdpa")

    model = make_with_attention(name, "eager")
    offloaded_layers = sum(1 for spec in describe_layers(model.config, MAX_CACHE_LEN)
                           if spec.attention == OFFLOADED)
    cache = offloaded(model, 2, resident_layers=min(1, offloaded_layers))
    for round_, (length, seed, pads) in enumerate(((12, 2, (3, 0)), (5, 3, (0, 2)))):
        if round_:
            cache.reset()
            test.assertEqual(cache.get_seq_length(), 0)
        ids, mask = prompts(2, length, seed=seed, pad_rows=pads)
        case = f"{name}: two left-padded rows, partly resident, eager" + (
            ", after reset()" if round_ else "")
        test.assertEqual(greedy(model, cache, ids, mask).tolist(),
                         greedy(model, reference_cache(model), ids, mask).tolist(), case)
        test.assertEqual(cache.get_seq_length(), length + NEW_TOKENS - 1, case)
