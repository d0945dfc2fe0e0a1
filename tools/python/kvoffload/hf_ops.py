"""``torch.ops.kvoffload.update``: the offloaded layers' update as a torch custom op, so that a
forward compiled with ``torch.compile(fullgraph=True)`` runs it in the graph instead of breaking
at the cache.

    keys, values = torch.ops.kvoffload.update(key_states, value_states, cache, layer, rows,
                                              max_seq)

``cache`` is a live native cache's handle (``register``) in a 0-d int64 CPU tensor: dynamo guards a
tensor by its dtype, device and shape, never by its value, so a second cache of the same shape
reuses the graph compiled for the first (an int would be specialized, and a new handle would
recompile). ``layer`` is its offloaded-layer index; ``rows`` the keys it returns per batch row
(tokens before this forward plus this forward's), which the Python side tracks as an int, so the
output's shape is known while tracing (a symbolic int under dynamic shapes); ``max_seq`` the rows
between two batch rows of the output: the cache's max_cache_len when the outputs are views of its
device buffer, as in eager mode, and ``rows`` for a quantized cache, whose outputs are new
dequantized tensors. Either way they are [batch, kv_heads, rows, head_dim] with strides [max_seq *
kv_heads * head_dim, head_dim, kv_heads * head_dim, 1] (token-major; values with their own
head_dim), which the fake implementation reproduces exactly so that compiled code indexes them as
they are. The fake implementation reads nothing but its arguments' shapes.

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


def register(cache) -> torch.Tensor:
    """A handle for ``cache`` (an OffloadedStaticCache with a native cache), valid while it lives:
    a 0-d int64 CPU tensor, the op's ``cache`` argument."""
    handle = next(_NEXT_HANDLE)
    _CACHES[handle] = cache
    return torch.tensor(handle, dtype=torch.int64)


def find(cache: torch.Tensor):
    """The cache a handle names, or None when it is gone."""
    return _CACHES.get(int(cache))


def owner(cache: torch.Tensor):
    """The cache a handle names (``register``)."""
    handle = int(cache)
    found = _CACHES.get(handle)
    if found is None:
        raise RuntimeError(f"kvoffload: cache handle {handle} names no live cache")
    return found


@torch.library.custom_op("kvoffload::update", mutates_args=(), tags=(torch.Tag.cudagraph_unsafe,))
def update(key_states: torch.Tensor, value_states: torch.Tensor, cache: torch.Tensor, layer: int,
           rows: int, max_seq: int) -> tuple[torch.Tensor, torch.Tensor]:
    keys, values = owner(cache)._native.update(key_states, value_states, layer)
    if keys.shape[2] != rows:
        raise RuntimeError(
            f"kvoffload.update: the native cache returned {keys.shape[2]} rows per batch row for "
            f"offloaded layer {layer}, the traced graph expects {rows}"
        )
    return keys, values


@update.register_fake
def _(key_states, value_states, cache, layer, rows, max_seq):
    def view_of(states):
        batch, kv_heads, _, head_dim = states.shape
        strides = (max_seq * kv_heads * head_dim, head_dim, kv_heads * head_dim, 1)
        return states.new_empty_strided((batch, kv_heads, rows, head_dim), strides)

    return view_of(key_states), view_of(value_states)
