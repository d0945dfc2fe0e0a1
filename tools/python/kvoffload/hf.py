"""kvoffload.hf: kvoffload's offloaded static KV cache as a Hugging Face transformers ``Cache``.

    from kvoffload.hf import OffloadedStaticCache
    cache = OffloadedStaticCache(model.config, max_batch_size=1, max_cache_len=32768,
                                 device=model.device, dtype=model.dtype)
    out = model.generate(**inputs, max_new_tokens=256, cache=cache)   # or past_key_values=cache

Everything is planned and allocated by the constructor (device arena, pinned host store); nothing
is allocated by the cache afterwards, and a step that would pass ``max_cache_len`` raises instead
of growing anything. Weights do not matter to it: bf16, AWQ, GPTQ, AQLM or bitsandbytes weights all
produce the same K/V tensors.

What this module relies on in transformers 5.x (checked against 5.24; cache_utils.py,
masking_utils.py, generation/utils.py, models/{llama,mistral,qwen2}/modeling_*.py):

1. The cache is passed as ``generate(cache=...)``; ``past_key_values=`` is a deprecated alias (until
   6.0) that generate renames to ``cache``. A user cache is used as is: generate marks it
   ``_is_user_defined`` and never rebuilds or resizes it.
2. Each decoder layer's attention calls ``cache.update(key_states, value_states, layer_idx,
   kwargs=...)`` once per forward, for layer_idx = 0, 1, ..., L-1 in order, with key_states and
   value_states of shape [batch, kv_heads, n, head_dim] (n = prompt length at prefill, 1 while
   decoding), and runs attention over the (keys, values) it returns before the next layer's update.
   ``Cache.update`` forwards to ``self.layers[layer_idx].update(key_states, value_states, ...)``.
3. There is no ``cache_position`` in 5.x: new rows go at the cache's current length, and position
   ids come from the 2-D attention mask (cumsum) or from ``cache.get_seq_length()``. Older
   versions passed ``cache_kwargs={"cache_position": ...}``; when one arrives on the CPU it is
   checked to continue the cache (a CUDA one is not read: that would sync the device per layer).
4. Masks (masking_utils._preprocess_mask_arguments) are built once per forward, before layer 0's
   update, from ``cache.get_query_offset(layer_idx)`` (= ``get_seq_length``) and
   ``cache.get_mask_sizes(query_length, layer_idx)`` -> (kv_length, kv_offset). The 2-D padding
   mask generate passes has one column per token seen so far, i.e. get_seq_length() + n.
5. ``is_compileable`` False keeps generate from compiling the forward and from turning the 2-D
   mask into a 4-D one of static size; the cache is not traceable (it calls into C++).
6. ``get_seq_length()`` is read before each forward (positions, masks, prefill slicing);
   ``reset()`` empties the cache; ``crop(-k)`` drops the last k tokens (only when generate
   rolls back a step); ``reorder_cache`` / ``batch_repeat_interleave`` / ``batch_select_indices``
   are for beam search and contrastive search, which this cache refuses.

What the cache returns (one consistent choice, the same as the native adapter's,
kvoffload/torch.hpp): ``update`` returns only the valid rows, keys and values each
[batch, kv_heads, len + n, head_dim] (len = tokens before this forward), as zero-copy *strided*
views of the cache's device buffer (the buffer is token-major, so the views are not contiguous;
transformers' sdpa and eager attention take strided keys; the tests run both). ``get_mask_sizes``
therefore answers (len + n, 0), as transformers' DynamicLayer does, so the mask has one column per
returned key and padding columns of the 2-D mask line up with the stored padding rows. The views
are valid until the next call on the cache (the next layer's update may reuse the buffer): they are
for that layer's attention only. transformers' StaticLayer instead returns its whole
max_cache_len buffer and a mask of max_cache_len columns; the visible keys are the same.

Streams: on a CUDA device the native cache orders its work on torch's *current* CUDA stream of
that device (acquire waits on an event, release records one; copies run on the cache's own copy
streams). For CPU tensors it uses the host backend: "device" memory is host memory, copies happen on
the calling thread, and every byte count is exact.

Limits: every row of a batch is one of the cache's slots, so the batch holds at most
max_batch_size rows (a smaller batch uses the first slots); all rows advance together (left padding, as generate does); no beam search; only
attention layers that keep every token (full attention, or a sliding/chunked window no shorter
than max_cache_len); one kv_heads/head_dim for every layer.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, get_layer_types_and_kwargs

from . import _native

__all__ = ["OffloadedStaticCache", "OffloadedLayer", "UnsupportedModelError"]

# torch dtype -> the library's name for it (kvoffload/types.hpp: parse_dtype).
_DTYPES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}

# Layer types (transformers' get_layer_types_and_kwargs) that keep no per-token K/V, or more than
# K/V, and why this cache cannot hold them.
_UNSUPPORTED_LAYER_TYPES = {
    "linear_attention": "it keeps a recurrent state, not per-token keys and values",
    "conv": "it keeps a convolution state, not per-token keys and values",
    "hybrid": "it keeps a linear-attention state besides its keys and values",
    "hybrid_sliding": "it keeps a linear-attention state besides its keys and values",
    "indexed_attention": "it keeps an indexer key cache besides its keys and values",
    "dummy": "it stores no keys and values of its own (a shared-KV or attention-free layer)",
}
_WINDOWED_LAYER_TYPES = ("sliding_attention", "chunked_attention")


class UnsupportedModelError(ValueError):
    """The model has layers this cache cannot serve; the message names them and says why."""


def _per_layer_configs(text_config) -> list:
    """One config per decoder layer (transformers' heterogeneous configs), or the config itself."""
    layers = int(text_config.num_hidden_layers)
    per_layer = getattr(text_config, "per_layer_config", None)
    if per_layer is not None and len(per_layer) == layers:
        return list(per_layer)
    return [text_config] * layers


def _kv_shape(layer_config) -> tuple[int, int]:
    """(kv_heads, head_dim) of one layer, the way Llama-family attention computes them."""
    heads = int(layer_config.num_attention_heads)
    kv_heads = getattr(layer_config, "num_key_value_heads", None) or heads
    head_dim = getattr(layer_config, "head_dim", None) or layer_config.hidden_size // heads
    return int(kv_heads), int(head_dim)


def _check_layers(text_config, max_cache_len: int) -> tuple[int, int, int]:
    """Returns (layers, kv_heads, head_dim), or raises UnsupportedModelError naming every layer
    the cache cannot serve and why."""
    if getattr(text_config, "is_encoder_decoder", False):
        raise UnsupportedModelError(
            "kvoffload's OffloadedStaticCache serves decoder-only models: an encoder-decoder model "
            "also needs a cross-attention cache (transformers' EncoderDecoderCache)"
        )
    if getattr(text_config, "kv_lora_rank", None):
        raise UnsupportedModelError(
            "kvoffload's OffloadedStaticCache cannot serve multi-head latent attention "
            f"(kv_lora_rank={text_config.kv_lora_rank}): its keys and values differ in head size"
        )
    layer_types, layer_kwargs = get_layer_types_and_kwargs(text_config)
    configs = _per_layer_configs(text_config)
    problems = []
    for idx, (layer_type, kwargs) in enumerate(zip(layer_types, layer_kwargs)):
        if layer_type == "full_attention":
            continue
        if layer_type in _WINDOWED_LAYER_TYPES:
            window = kwargs.get("sliding_window")
            # A window at least max_cache_len long never hides a token the cache can hold, so the
            # layer attends exactly as a full-attention layer does (the model's own sliding mask
            # is then the causal mask).
            if window is not None and int(window) >= max_cache_len:
                continue
            problems.append(
                f"layer {idx} ({layer_type}, window {window}): it attends only to the last "
                f"{window} tokens, and this cache keeps every token up to max_cache_len="
                f"{max_cache_len}; use max_cache_len <= {window} or transformers' own caches"
            )
            continue
        reason = _UNSUPPORTED_LAYER_TYPES.get(layer_type, "the cache does not know this layer type")
        problems.append(f"layer {idx} ({layer_type}): {reason}")
    shapes = [_kv_shape(c) for c in configs]
    for idx, shape in enumerate(shapes):
        if shape != shapes[0]:
            problems.append(
                f"layer {idx}: kv_heads={shape[0]}, head_dim={shape[1]} differ from layer 0's "
                f"kv_heads={shapes[0][0]}, head_dim={shapes[0][1]} (one shape for every layer)"
            )
    v_head_dim = getattr(text_config, "v_head_dim", None)
    if v_head_dim is not None and int(v_head_dim) != shapes[0][1]:
        problems.append(f"values have head_dim {v_head_dim}, keys {shapes[0][1]} (must be equal)")
    if problems:
        model = getattr(text_config, "model_type", None) or type(text_config).__name__
        raise UnsupportedModelError(
            f"kvoffload's OffloadedStaticCache cannot serve {len(problems)} layer(s) of this "
            f"{model} model:\n  " + "\n  ".join(problems)
        )
    return len(layer_types), shapes[0][0], shapes[0][1]


def _resolve_device(device) -> torch.device:
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if device.type not in ("cuda", "cpu"):
        raise ValueError(f"kvoffload's OffloadedStaticCache runs on cuda or cpu, not {device}")
    return device


def _resolve_dtype(dtype, text_config) -> torch.dtype:
    if dtype is None:
        dtype = getattr(text_config, "dtype", None) or torch.get_default_dtype()
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None)
    if dtype not in _DTYPES:
        raise ValueError(
            f"kvoffload's OffloadedStaticCache stores float32, float16 or bfloat16 keys and "
            f"values, not {dtype}"
        )
    return dtype


def _find_cache_position(args, kwargs):
    """A ``cache_position`` tensor in the cache_kwargs of older transformers, else None."""
    candidates = list(args) + [kwargs, kwargs.get("kwargs"), kwargs.get("cache_kwargs")]
    for candidate in candidates:
        if isinstance(candidate, dict) and torch.is_tensor(candidate.get("cache_position")):
            return candidate["cache_position"]
    return None


class OffloadedLayer(CacheLayerMixin):
    """One decoder layer's view of an OffloadedStaticCache: every call goes to the shared native
    cache (the per-step protocol spans all layers, so the layers cannot be independent)."""

    is_compileable = False
    is_croppable = True
    is_sliding = False  # windowed layers are only accepted when the window hides nothing
    supports_early_init = True

    def __init__(self, cache: "OffloadedStaticCache", layer_idx: int):
        super().__init__()
        self._cache = cache
        self.layer_idx = layer_idx
        # Allocated by the cache's constructor; `keys`/`values` stay None because the returned
        # views do not outlive the layer's attention (see the module docstring).
        self.is_initialized = True
        self.device = cache.device
        self.dtype = cache.dtype
        self.max_cache_len = cache.max_cache_len
        self.batch_size = cache.max_batch_size

    def lazy_initialization(self, key_states, value_states) -> None:
        """Nothing to do: the constructor allocated everything."""

    def update(self, key_states, value_states, *args, **kwargs):
        return self._cache._update(key_states, value_states, self.layer_idx, args, kwargs)

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

    # Every layer shares the native cache's lengths: the operations below act on all layers at
    # once and are the cache's (OffloadedStaticCache overrides the Cache methods that would
    # otherwise call them layer by layer).
    def reset(self) -> None:
        self._cache.reset()  # idempotent: one reset empties every layer

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError(
            "the layers of kvoffload's OffloadedStaticCache share one length: crop the cache "
            "(cache.crop), not a layer"
        )

    def reorder_cache(self, beam_idx) -> None:
        self._cache.reorder_cache(beam_idx)


class OffloadedStaticCache(Cache):
    """A transformers ``Cache`` backed by kvoffload's offloaded static cache.

    Args:
        config: the model's config (``model.config``); its decoder part gives the number of
            layers, ``num_key_value_heads`` and ``head_dim``, and the layer types.
        max_batch_size: the most rows a batch may have; generate may be called with fewer.
        max_cache_len: tokens per row, prompt included, allocated now; a generate that goes past
            it raises ValueError.
        device: where attention runs (``model.device``); a CUDA device uses the CUDA backend, the
            CPU the host backend. Default: the current CUDA device, else the CPU.
        dtype: of the keys and values (``model.dtype``). Default: the config's dtype.
        vram_budget: device bytes the cache may use (an int, or a string such as ``"6GiB"``);
            None: on CUDA, the device's free memory at construction; on the CPU, unlimited.
        resident_layers: layers kept whole on the device (no copies); None: as many as the budget
            holds. The rest are streamed through ``ring_depth`` staging buffers.
        ring_depth: staging buffers for streamed layers (2: one computes while one loads).

    Raises:
        UnsupportedModelError: the model has layers the cache cannot serve (named, with why).
        ValueError: a bad size, device or dtype. MemoryError: the plan does not fit the budget, or
            an allocation failed (the message names the bytes).
    """

    def __init__(
        self,
        config,
        max_batch_size: int,
        max_cache_len: int,
        device=None,
        dtype=None,
        vram_budget=None,
        resident_layers: int | None = None,
        ring_depth: int = 2,
    ):
        text_config = config.get_text_config(decoder=True)
        self._text_config = text_config
        for name, value in (("max_batch_size", max_batch_size), ("max_cache_len", max_cache_len)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        layers, kv_heads, head_dim = _check_layers(text_config, max_cache_len)
        self.device = _resolve_device(device)
        self.dtype = _resolve_dtype(dtype, text_config)
        self.max_batch_size = max_batch_size
        self.max_cache_len = max_cache_len
        self.num_key_value_heads = kv_heads
        self.head_dim = head_dim
        # The forward in progress: the last layer updated and its token count (None between
        # forwards). The native cache counts a forward's tokens from its layer 0's update on.
        self._open_layer = None
        self._open_tokens = 0

        budget = 0  # the library's "no budget" (see vram_budget above)
        if vram_budget is not None:
            if isinstance(vram_budget, str):
                budget = _native.parse_size(vram_budget)
            else:
                budget = int(vram_budget)
            if budget <= 0:
                raise ValueError(f"vram_budget must be positive bytes, got {vram_budget!r}")
        if resident_layers is None:
            resident = -1  # kvo::kAutoResidentLayers
        elif 0 <= int(resident_layers) <= layers:
            resident = int(resident_layers)
        else:
            raise ValueError(f"resident_layers must be in [0, {layers}], got {resident_layers!r}")
        if self.device.type == "cuda":
            backend = "cuda"
            if _native.cuda_device_count() == 0:
                raise ValueError(
                    f"device {self.device} asks for the CUDA backend, but this kvoffload build "
                    "has none (built without CUDA, or no usable GPU for it)"
                )
        else:
            backend = "host"

        # Plans and allocates every byte now (kvoffload/cache.hpp).
        self._native = _native.Cache(
            layers=layers,
            kv_heads=kv_heads,
            head_dim=head_dim,
            max_seq=max_cache_len,
            slots=max_batch_size,
            dtype=_DTYPES[self.dtype],
            backend=backend,
            device=self.device.index or 0,
            resident_layers=resident,
            ring_depth=ring_depth,
            device_budget=budget,
        )
        super().__init__(layers=[OffloadedLayer(self, idx) for idx in range(layers)])

    def __repr__(self) -> str:
        plan = self._native.stats()["plan"]
        return (
            f"{type(self).__name__}(layers={len(self.layers)}, max_batch_size="
            f"{self.max_batch_size}, max_cache_len={self.max_cache_len}, device={self.device}, "
            f"dtype={self.dtype}, resident_layers={plan['resident_layers']}, "
            f"streamed_layers={plan['streamed_layers']}, device_bytes={plan['device_bytes']}, "
            f"host_bytes={plan['host_bytes']})"
        )

    # ---- the per-layer update ------------------------------------------------------------------

    def _update(self, key_states, value_states, layer_idx: int, args, kwargs):
        # The checks transformers users hit first, in their words; the native cache checks the
        # same again (shape, dtype, device, order) and names what it expected.
        for name, states in (("key_states", key_states), ("value_states", value_states)):
            if states.dtype != self.dtype:
                raise ValueError(
                    f"layer {layer_idx}: {name} are {states.dtype} but the cache was built for "
                    f"{self.dtype}; build it with dtype=model.dtype"
                )
            if states.device != self.device:
                raise ValueError(
                    f"layer {layer_idx}: {name} are on {states.device} but the cache was built for "
                    f"{self.device}; build it with device=model.device (for a model split over "
                    "several devices, one cache per device is not supported)"
                )
            if states.dim() != 4 or tuple(states.shape[1::2]) != (
                self.num_key_value_heads,
                self.head_dim,
            ):
                raise ValueError(
                    f"layer {layer_idx}: {name} have shape {tuple(states.shape)}, expected "
                    f"[batch, {self.num_key_value_heads} (kv heads), tokens, {self.head_dim} "
                    "(head_dim)] as the model config says; this model's attention does not store "
                    "Llama-style keys and values"
                )
        batch, tokens = key_states.shape[0], key_states.shape[2]
        if batch > self.max_batch_size:
            raise ValueError(
                f"the batch has {batch} rows but the cache was built for max_batch_size="
                f"{self.max_batch_size}; build it with max_batch_size={batch}"
            )
        if layer_idx == 0:
            held = self._native.get_seq_length()  # commits the previous step
            if held + tokens > self.max_cache_len:
                raise ValueError(
                    f"the cache holds {held} tokens per row and this forward adds {tokens}: "
                    f"{held + tokens} would pass max_cache_len={self.max_cache_len}. Build the "
                    "cache with max_cache_len >= prompt length + max_new_tokens (it is allocated "
                    "once and never grows), or reset() it between generations"
                )
        position = _find_cache_position(args, kwargs)
        if position is not None and position.device.type != "cpu":
            position = None  # reading it would sync the device once per layer
        keys, values = self._native.update(key_states, value_states, layer_idx, position)
        self._open_layer, self._open_tokens = layer_idx, tokens
        return keys, values

    def _tokens_before_forward(self) -> int:
        """Tokens per row before the forward in progress (all of them between forwards)."""
        held = self._native.get_seq_length()  # commits a complete forward
        if self._open_layer is not None and self._open_layer < len(self.layers) - 1:
            held -= self._open_tokens  # mid-forward: layer 0 already holds this forward's rows
        return held

    # ---- transformers' Cache interface -----------------------------------------------------------

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Tokens per row, counting the current forward's once its layer 0 was updated."""
        return self._native.get_seq_length()

    def get_max_length(self, layer_idx: int | None = None) -> int:
        return self.max_cache_len

    def get_max_cache_shape(self, layer_idx: int = 0) -> int:
        """The name transformers 4.x used for get_max_length."""
        return self.max_cache_len

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        # One mask column per key update returns: the tokens before this forward, plus its own.
        # Right also when asked in the middle of a forward, before a layer's update (a model that
        # builds masks per layer); once the last layer is updated, the next forward's.
        return self._tokens_before_forward() + query_length, 0

    def reset(self) -> None:
        """Empties every row (lengths back to 0); drops a forward left half-done by an error."""
        self._native.reset()
        self._open_layer = None

    def crop(self, tokens_to_remove: int) -> None:
        """Drops the last ``-tokens_to_remove`` tokens of every row (a negative int, as for
        transformers' static layers; 0 does nothing)."""
        if tokens_to_remove > 0:
            raise ValueError(
                "crop takes a negative int, the number of tokens to remove, as transformers' "
                f"static caches do; got {tokens_to_remove}"
            )
        if tokens_to_remove == 0:
            return
        held = self._native.get_seq_length()
        self._native.truncate(max(held + tokens_to_remove, 0))
        self._open_layer = None

    def _refuse(self, what: str):
        raise NotImplementedError(
            f"kvoffload's OffloadedStaticCache does not support {what}: its rows are fixed slots "
            "that advance together (use greedy decoding or sampling, num_beams=1)"
        )

    def reorder_cache(self, beam_idx) -> None:
        self._refuse("beam search (reorder_cache)")

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._refuse("repeating rows (batch_repeat_interleave)")

    def batch_select_indices(self, indices) -> None:
        self._refuse("selecting rows (batch_select_indices)")

    @property
    def is_compileable(self) -> bool:
        return False

    # ---- kvoffload's own ---------------------------------------------------------------------

    @property
    def backend(self) -> str:
        """"cuda" or "host"."""
        return self._native.backend

    def stats(self) -> dict[str, Any]:
        """Counters of the native cache (kvoffload/cache.hpp: CacheStats) after committing the
        last forward: steps, h2d_bytes_total, d2h_bytes_total, h2d/d2h_bytes_last_step,
        acquire_wait_s, prefetch_reissues, device_allocations (fixed after construction), and
        ``plan``: resident/streamed layers, ring_depth, row/tensor/layer bytes, device_bytes (the
        one device arena), host_bytes (the pinned store)."""
        self._native.get_seq_length()  # commits a complete forward, so the counters include it
        return self._native.stats()

    # ---- saved contexts ------------------------------------------------------------------------

    def save(self, path, tokens=None) -> None:
        """Saves every row (its keys and values in every layer, and its length) to ``path``,
        written atomically, with a fingerprint of the model config (model_type, layers, heads,
        head_dim, hidden size, vocabulary, rope theta) and the K/V dtype; each layer's rows carry
        a checksum. ``tokens``: the ids each row holds (a list per row, or one list for a single
        row), kept in the file and returned by ``load``. A forward left half-done is refused."""
        if tokens is not None and tokens and isinstance(tokens[0], int):
            tokens = [tokens]
        tokens = [list(map(int, t)) for t in (tokens or [])]
        self._native.save(str(path), tokens, self._fingerprint)

    @classmethod
    def load(cls, path, config, device=None, dtype=None, vram_budget=None,
             resident_layers: int | None = None, ring_depth: int = 2) -> "OffloadedStaticCache":
        """A new cache holding the rows saved in ``path`` (no prefill): max_batch_size and
        max_cache_len come from the file, which must have been saved for the same model config
        and dtype (refused otherwise, naming the difference; a truncated or corrupted file is
        refused naming the failing layer block). ``cache.saved_tokens`` holds each row's token
        ids. Continue with ``model.generate(full_ids, cache=cache)``: transformers feeds only the
        ids past ``cache.get_seq_length()``."""
        info = _native.inspect_saved_context(str(path))
        if dtype is None:
            dtype = {v: k for k, v in _DTYPES.items()}[info["dtype"]]
        cache = cls(config, max_batch_size=len(info["lengths"]), max_cache_len=info["max_seq"],
                    device=device, dtype=dtype, vram_budget=vram_budget,
                    resident_layers=resident_layers, ring_depth=ring_depth)
        cache.saved_tokens = cache._native.load(str(path), cache._fingerprint)
        cache._open_layer = None
        return cache

    @property
    def _fingerprint(self) -> str:
        text = self._text_config
        fields = ("model_type", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                  "hidden_size", "intermediate_size", "vocab_size", "rope_theta")
        lines = [f"{name}={getattr(text, name, None)}" for name in fields]
        lines.append(f"head_dim={self.head_dim}")
        return "\n".join(lines)

    def plan(self) -> dict[str, Any]:
        """Where the bytes are: the ``plan`` part of stats()."""
        return self._native.stats()["plan"]
