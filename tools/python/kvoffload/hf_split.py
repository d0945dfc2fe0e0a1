"""Split attention in the drop-in: for a streamed layer of a decode step, the host attends the rows
before the split where they are, in the pinned store (the library's host attention, through the C
ABI), while the device attends the staged rows after it, and the two merge exactly by their
log-sum-exps; only the rows after the split cross the bus.

``OffloadedStaticCache(..., split="auto")`` (or a number of rows) turns it on for the model whose
config it is given: it registers an attention function with transformers (``AttentionInterface``,
and the mask function of the attention the model had) and sets the config's attention to it. That
function attends the layers that split through the cache and hands every other layer (prefill,
resident layers, windows) to the attention the model had. A layer that split and was attended by
anything else is refused at the next update (its staged rows before the split are not its keys),
so it cannot be half on. Under ``torch.compile`` the split layer's attention is the custom op
``torch.ops.kvoffload.attend``, opaque to the graph.
"""

from __future__ import annotations

import sys

import torch
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from . import _native, hf_ops

# One attention name per attention a model may have had, registered once with that attention's
# masks: a new cache of the same shape then changes no name, and a compiled graph is reused.
NAMES = {"sdpa": "kvoffload_split_sdpa", "eager": "kvoffload_split_eager"}
ORIGINALS = {name: original for original, name in NAMES.items()}


def original_of(name: str | None) -> str:
    """The attention a model had before a split cache replaced it."""
    return ORIGINALS.get(name, name or "sdpa")


def _attention_for(original: str):
    def attention(module, query, key, value, attention_mask, **kwargs):
        slots = getattr(module.config, "_kvoffload_split_slots", None)
        layer = getattr(module, "layer_idx", None)
        if (slots is not None and layer is not None and 0 <= layer < len(slots)
                and slots[layer] >= 0 and query.shape[2] == 1):
            handle = module.config._kvoffload_split
            scaling = kwargs.get("scaling")
            scaling = float(scaling) if scaling is not None else query.shape[-1] ** -0.5
            softcap = float(kwargs.get("softcap") or 0.0)
            sinks = kwargs.get("s_aux")  # gpt-oss's per-head sink logits
            if torch.compiler.is_compiling():
                out = torch.ops.kvoffload.attend(query, key, value, attention_mask, sinks,
                                                 handle, slots[layer], scaling, softcap)
                return out, None
            cache = hf_ops.find(handle)
            # Eagerly: the layer that split is attended here; a step that did not split, or a
            # model whose cache is another (a StaticCache, a cache built later), by the model's
            # own attention.
            if cache is not None and cache._native.returned(slots[layer], key):
                if cache._native.splits_now():
                    out = cache._native.attend(query, key, value, attention_mask, slots[layer],
                                               scaling, softcap, sinks)
                    return out, None
                cache._native.attended()
        if original == "eager":  # each model's own eager attention (soft caps, sinks, ...)
            function = sys.modules[type(module).__module__].eager_attention_forward
        else:
            function = ALL_ATTENTION_FUNCTIONS[original]
        return function(module, query, key, value, attention_mask, **kwargs)

    return attention


def install(handle: torch.Tensor, slots: list, config, text_config) -> None:
    """Makes `config`'s attention the split attention of the cache `handle` names: `slots[i]`
    is model layer i's index among the cache's offloaded layers where it is streamed (it may
    split), else -1. The last cache installed for a model is the one its attention reads."""
    original = original_of(getattr(config, "_attn_implementation", None))
    if original not in NAMES:
        raise ValueError(
            f"split attention hands the layers that do not split to the model's attention, "
            f"{original!r} here; it takes 'sdpa' or 'eager' (load the model with "
            "attn_implementation='sdpa' or 'eager')")
    name = NAMES[original]
    if name not in ALL_ATTENTION_FUNCTIONS._global_mapping:
        AttentionInterface.register(name, _attention_for(original))
        AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[original])
    text_config._kvoffload_split = handle
    text_config._kvoffload_split_slots = tuple(slots)
    config._attn_implementation = name


@torch.library.custom_op("kvoffload::attend", mutates_args=(),
                         tags=(torch.Tag.cudagraph_unsafe,))
def attend(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
           mask: torch.Tensor | None, sinks: torch.Tensor | None, cache: torch.Tensor,
           layer: int, scaling: float, softcap: float) -> torch.Tensor:
    owner = hf_ops.find(cache)
    if owner is not None and owner._native.returned(layer, keys):
        return owner._native.attend(query, keys, values, mask, layer, scaling, softcap, sinks)
    # Keys another cache returned (a compiled model run with a StaticCache after a split cache
    # set its attention): attention over all of them.
    return _native.plain_attention(query, keys, values, mask, scaling, softcap, sinks)


@attend.register_fake
def _(query, keys, values, mask, sinks, cache, layer, scaling, softcap):
    batch, heads, n, dim = query.shape
    return query.new_empty((batch, n, heads, dim))
