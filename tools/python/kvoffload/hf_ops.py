"""``torch.ops.kvoffload.update``: the offloaded layers' update as a torch custom op, so that a
forward compiled with ``torch.compile(fullgraph=True)`` runs it in the graph instead of breaking
at the cache.

    keys, values = torch.ops.kvoffload.update(key_states, value_states, layer, rows)

``layer`` names one offloaded layer of a live native cache (``register`` hands out these names; a
string, so that dynamo keeps it a constant even when it makes every int symbolic); ``rows`` the keys it returns per batch row (tokens before this forward plus this forward's), which
the Python side tracks as an int, so the output's shape is known while tracing (a symbolic int
under dynamic shapes). The outputs are views of the cache's device buffer, as in eager mode:
[batch, kv_heads, rows, head_dim] with strides [max_seq * kv_heads * head_dim, head_dim,
kv_heads * head_dim, 1] (token-major), which the fake implementation reproduces exactly so that
compiled code indexes them as they are.

The op does host-side work (the per-step protocol, prefetch scheduling) that a CUDA graph would
not replay, so it is tagged ``cudagraph_unsafe``: inductor keeps it out of captured graphs.
Eager callers do not go through the op (it would only add dispatch overhead).
"""

from __future__ import annotations

import itertools
import weakref

import torch

# handle -> the OffloadedStaticCache whose native cache the op drives.
_CACHES: "weakref.WeakValueDictionary[int, object]" = weakref.WeakValueDictionary()
_NEXT_HANDLE = itertools.count(1)


def register(cache, offloaded_layers: int) -> list[str]:
    """The op's names for the offloaded layers of ``cache`` (an OffloadedStaticCache with a native
    cache), valid while it lives: "<handle>/<offloaded layer index>"."""
    handle = next(_NEXT_HANDLE)
    _CACHES[handle] = cache
    return [f"{handle}/{slot}" for slot in range(offloaded_layers)]


def _layer(name: str):
    """(cache, offloaded layer index) of a name ``register`` gave out."""
    handle, slot = name.split("/")
    cache = _CACHES.get(int(handle))
    if cache is None:
        raise RuntimeError(f"kvoffload.update: layer {name!r} names no live cache")
    return cache, int(slot)


@torch.library.custom_op("kvoffload::update", mutates_args=(), tags=(torch.Tag.cudagraph_unsafe,))
def update(key_states: torch.Tensor, value_states: torch.Tensor, layer: str,
           rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    cache, slot = _layer(layer)
    keys, values = cache._native.update(key_states, value_states, slot)
    if keys.shape[2] != rows:
        raise RuntimeError(
            f"kvoffload.update: the native cache returned {keys.shape[2]} rows per batch row for "
            f"offloaded layer {slot}, the traced graph expects {rows}"
        )
    return keys, values


@update.register_fake
def _(key_states, value_states, layer, rows):
    max_seq = _layer(layer)[0].max_cache_len

    def view_of(states):
        batch, kv_heads, _, head_dim = states.shape
        strides = (max_seq * kv_heads * head_dim, head_dim, kv_heads * head_dim, 1)
        return states.new_empty_strided((batch, kv_heads, rows, head_dim), strides)

    return view_of(key_states), view_of(value_states)
