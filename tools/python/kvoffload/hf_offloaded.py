"""The layers whose keys and values kvoffload's native runtime keeps (full attention, resident or
streamed): thin transformers layer objects over the shared cache, which drives the per-step
protocol across all of them (kvoffload/hf.py). A ``hybrid`` layer (Falcon-H1) also keeps a state
on the device (kvoffload/hf_local.py)."""

from __future__ import annotations

import torch
from transformers.cache_utils import CacheLayerMixin

from .hf_layers import LayerSpec
from .hf_local import StateLayer


class OffloadedLayer(CacheLayerMixin):
    """One full-attention layer whose keys and values the native cache keeps: every call goes to
    the shared cache (the per-step protocol spans all offloaded layers, so they cannot be
    independent)."""

    is_compileable = True
    is_croppable = True
    is_sliding = False
    supports_early_init = True  # and initialized at construction: early_initialization skips it

    def __init__(self, cache: "OffloadedStaticCache", layer_idx: int):
        super().__init__()
        self._cache = cache
        self.layer_idx = layer_idx
        # `keys`/`values` stay None: the returned views do not outlive the layer's attention.
        self.is_initialized = True
        self.device = cache.device
        self.dtype = cache.dtype
        self.max_cache_len = cache.max_cache_len
        self.batch_size = cache.max_batch_size

    def lazy_initialization(self, key_states, value_states) -> None:
        """Nothing to do: the constructor allocated everything."""

    def update(self, key_states, value_states, *args, **kwargs):
        return self._cache.update(key_states, value_states, self.layer_idx)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self._cache.get_mask_sizes(query_length, self.layer_idx)

    def get_seq_length(self) -> int:
        return self._cache.get_seq_length()

    def get_max_length(self) -> int:
        return self.max_cache_len

    def offload(self):
        """Not needed: the native cache moves the bytes itself."""

    def prefetch(self):
        """Not needed: the native cache prefetches each layer itself."""

    # The offloaded layers share the native cache's lengths: these act on the whole cache.
    def reset(self) -> None:
        self._cache.reset()

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError(
            "the layers of kvoffload's OffloadedStaticCache share one length: crop the cache "
            "(cache.crop), not a layer"
        )

    def reorder_cache(self, beam_idx) -> None:
        self._cache.reorder_cache(beam_idx)

    def buffers(self) -> list[torch.Tensor]:
        return []


class OffloadedStateLayer(StateLayer, OffloadedLayer):
    """A ``hybrid`` layer (Falcon-H1): full-attention keys and values in the native cache, and a
    state on the device."""

    def __init__(self, cache, spec: LayerSpec):
        OffloadedLayer.__init__(self, cache, spec.index)
        StateLayer.__init__(self, spec, cache.max_batch_size, cache.device, cache.dtype)

    def get_max_length(self) -> int:
        return self.max_cache_len

    def reset(self) -> None:
        StateLayer.reset(self)  # the cache resets its native part
