"""kvoffload.hf: kvoffload's offloaded static KV cache as a Hugging Face transformers ``Cache``.

    from kvoffload.hf import OffloadedStaticCache
    cache = OffloadedStaticCache(model.config, max_batch_size=1, max_cache_len=32768,
                                 device=model.device, dtype=model.dtype)
    out = model.generate(**inputs, max_new_tokens=256, cache=cache)   # or past_key_values=cache

Every layer is served by what it keeps (kvoffload/hf_layers.py): full-attention keys and values by
the native runtime (resident on the device or streamed through its staging ring); sliding and
chunked windows and fixed-size states (linear attention, convolutions, Mamba) in static device
buffers (kvoffload/hf_local.py). All of it is planned and allocated by the constructor; nothing is
allocated by the cache afterwards, and a step that would pass ``max_cache_len`` raises instead of
growing anything. Weights do not matter to it: bf16, int8, AWQ or GPTQ weights produce the same
keys and values.

What this module relies on in transformers 5.x (checked against 5.24; cache_utils.py,
masking_utils.py, generation/utils.py and the models' attention and mixers):

1. The cache is passed as ``generate(cache=...)`` (``past_key_values=`` is a deprecated alias);
   generate marks it ``_is_user_defined`` and never rebuilds or resizes it.
2. Each attention layer calls ``cache.update(key_states, value_states, layer_idx, kwargs=...)``
   once per forward, in layer order, with [batch, kv_heads, n, head_dim] tensors, and attends over
   what it returns before the next layer's update. Linear-attention and convolution mixers call
   ``get_conv_state`` / ``get_recurrent_state`` and ``update_conv_state`` /
   ``update_recurrent_state`` (MiniMax: ``get_linear_cache`` / ``set_linear_cache``, and it
   insists on a ``MiniMaxCache``, which this cache then is).
3. New rows go at the cache's current length; positions come from the 2-D attention mask or from
   ``get_seq_length()``, read before each forward.
4. Masks are built before the first layer from ``get_query_offset(layer_idx)`` and
   ``get_mask_sizes(query_length, layer_idx)`` of the first full-attention layer and the first
   sliding layer (``is_sliding``, ``is_linear``, ``is_dummy`` tell them apart). With a compileable
   cache, generate builds them in ``prepare_inputs_for_generation``, between forwards.
5. ``is_compileable`` lets generate compile the decode forward (on a CUDA device by default, on
   the CPU with ``CompileConfig(_compile_all_devices=True)``).

What the cache returns: ``update`` of an offloaded layer returns keys and values each [batch,
kv_heads, max_cache_len, head_dim], as transformers' StaticLayer does (the rows past the valid ones
hidden by the mask), as zero-copy *strided* views of the native cache's device buffer (token-major,
so not contiguous; transformers' sdpa and eager attention take strided keys); the views are made
once per buffer, through DLPack, and are valid until the next call on the cache (the next layer's
update may reuse the buffer): they are for that layer's attention only. With
``static_shapes=False`` it returns only the valid rows, [batch, kv_heads, len + n, head_dim] (len =
tokens before this forward), and ``get_mask_sizes`` answers (len + n, 0), as transformers'
DynamicLayer does. Window layers answer as transformers' static sliding layers do
(kvoffload/hf_local.py). Under ``torch.compile`` the offloaded update is the custom op
``torch.ops.kvoffload.update`` (kvoffload/hf_ops.py), the cache named by a tensor (dynamo guards
its shape, not its value, so a new cache of the same shape reuses the graph). With static shapes
a compiled forward reads no Python length at all, so one graph serves every decode step under
``dynamic=False``; without, the lengths are Python ints that dynamo turns into symbolic ints.

Tensor parallelism: on a model loaded with ``tp_plan="auto"`` under ``torchrun``, each rank's cache
holds that rank's KV heads, read from the model's config and torch.distributed; the ranks agree on
one plan while the caches are built, and save and load one file per rank (kvoffload/hf_tp.py).

Streams: on a CUDA device the native cache orders its work on torch's *current* CUDA stream of
that device (acquire waits on an event, release records one; copies run on the cache's own copy
streams). For CPU tensors it uses the host backend: "device" memory is host memory and every byte
count is exact.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import re
import warnings
import zlib
from typing import Any

import torch
from transformers.cache_utils import Cache, DummyLayer

from . import _native, hf_fingerprint, hf_ops, hf_split, hf_tp
from .hf_layers import OFFLOADED, WINDOW, KvLayout, UnsupportedModelError, describe_layers
from .hf_local import StateLayer, WindowLayer, WindowStateLayer
from .hf_offloaded import OffloadedLayer, OffloadedStateLayer

__all__ = ["OffloadedStaticCache", "OffloadedLayer", "UnsupportedModelError",
           "TensorParallelError"]

TensorParallelError = hf_tp.TensorParallelError

# torch dtype -> the library's name for it (kvoffload/types.hpp: parse_dtype).
_DTYPES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}
# K/V dtypes the native cache stores quantized (kvoffload/quant.hpp), by their names and torch's.
_QUANTIZED = {"fp8": "fp8", "fp8_e4m3": "fp8", "e4m3": "fp8", "int8": "int8",
              torch.float8_e4m3fn: "fp8", torch.int8: "int8"}

# Models whose forward insists on a cache class of their own: the cache is then also an instance
# of that class (its methods are all overridden here).
_MODEL_CACHE_CLASSES = {"minimax": ("transformers.models.minimax.modeling_minimax", "MiniMaxCache")}
_MIXED_CLASSES: dict = {}


def _resolve_device(device) -> torch.device:
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if not isinstance(device, (str, int, torch.device)) or isinstance(device, bool):
        raise TypeError(f"device must be a torch.device, a str such as 'cuda:0' or an int, got "
                        f"{type(device).__name__} {device!r}")
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if device.type not in ("cuda", "cpu"):
        raise ValueError(f"kvoffload's OffloadedStaticCache runs on cuda or cpu, not {device}")
    if device.type == "cpu" and device.index not in (None, 0):
        raise ValueError(f"there is one CPU device (cpu, or cpu:0), not {device}: tensors on it "
                         "are on 'cpu', and every update would be refused")
    if device.type == "cuda" and device.index >= torch.cuda.device_count():
        raise ValueError(f"{device} is not a device here ({torch.cuda.device_count()} CUDA "
                         "device(s))")
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


def _resolve_kv_dtype(kv_dtype, dtype: torch.dtype) -> str:
    """The library's name of the K/V dtype the native cache stores: the model's dtype by default,
    or fp8 (e4m3) or int8, quantized where the rows are appended and returned in ``dtype``."""
    if not (kv_dtype is None or isinstance(kv_dtype, (str, torch.dtype))):
        raise TypeError(f"kv_dtype must be None, a str ('fp8', 'int8') or a torch.dtype, got "
                        f"{type(kv_dtype).__name__} {kv_dtype!r}")
    if kv_dtype is None or kv_dtype == dtype:
        return _DTYPES[dtype]
    if kv_dtype in _QUANTIZED:
        return _QUANTIZED[kv_dtype]
    raise ValueError(
        f"kv_dtype is None (the model's dtype, {dtype}), 'fp8' (or torch.float8_e4m3fn) or "
        f"'int8' (or torch.int8), not {kv_dtype!r}"
    )


def _check_int(name: str, value, low: int, high: int) -> int:
    """``value`` as the int it must be, in [low, high]: a float, a bool or a string is refused
    (3.7 is not 3), and so is one past what the native cache can hold."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be from {low} to {high}, got {value!r}")
    return value


_INT32_MAX = 2**31 - 1


def _parse_budget(vram_budget) -> int | None:
    if vram_budget is None:
        return None
    if isinstance(vram_budget, str):
        budget = _native.parse_size(vram_budget)
    elif isinstance(vram_budget, bool) or not isinstance(vram_budget, int):
        raise TypeError(f"vram_budget must be bytes (an int) or a size such as '24GiB', got "
                        f"{type(vram_budget).__name__} {vram_budget!r}")
    else:
        budget = vram_budget
    if not 0 < budget < 2**64:
        raise ValueError(f"vram_budget must be positive bytes below 2^64, got {vram_budget!r}")
    return budget


def _check_config(config) -> None:
    if not hasattr(config, "get_text_config"):
        raise TypeError(f"config must be the model's config (model.config, a transformers "
                        f"PretrainedConfig), got {type(config).__name__}")


def _shard_of(config, text_config, specs) -> hf_tp.Shard:
    """This process's part of the model under tensor parallelism (hf_tp.find_shard)."""
    # The offloaded layers' heads name the native cache's range; windows are sharded alike.
    kv_specs = sorted((s for s in specs if s.attention), key=lambda s: s.attention != OFFLOADED)
    return hf_tp.find_shard(config, text_config, kv_specs[0].kv.kv_heads if kv_specs else None,
                            any(s.states for s in specs))


def _parse_split(split) -> tuple[str, int]:
    """(the native split mode, its rows) of the ``split`` argument."""
    if split is None or split is False:
        return "off", 0
    if split == "auto":
        return "auto", 0
    if isinstance(split, bool) or not isinstance(split, int) or not 0 <= split <= _INT32_MAX:
        raise ValueError(f"split is None (off), 'auto' or a number of rows >= 0, got {split!r}")
    return "rows", split


def _check_path(path) -> str:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__} {path!r}")
    return os.fspath(path)


class OffloadedStaticCache(Cache):
    """A transformers ``Cache`` backed by kvoffload's offloaded static cache.

    Args:
        config: the model's config (``model.config``); its decoder part gives each layer's type,
            its key and value sizes and its states.
        max_batch_size: the most rows a batch may have; generate may be called with fewer.
        max_cache_len: tokens per row, prompt included, allocated now; a generate that goes past
            it raises ValueError.
        device: where attention runs (``model.device``); a CUDA device uses the CUDA backend, the
            CPU the host backend. Default: the current CUDA device, else the CPU.
        dtype: of the keys, values and convolution states (``model.dtype``); recurrent states keep
            the dtype their model computes them in. Default: the config's dtype.
        vram_budget: device bytes the cache may use (an int, or a string such as ``"6GiB"``),
            windows and states included; None: on CUDA, the device's free memory at construction;
            on the CPU, unlimited.
        resident_layers: full-attention layers kept whole on the device (no copies); None: as
            many as the budget holds. The rest are streamed through ``ring_depth`` staging buffers.
        ring_depth: staging buffers for streamed layers (2: one computes while one loads).
        kv_dtype: what the native cache stores the full-attention keys and values in: None (the
            default) for ``dtype``; ``"fp8"`` (e4m3, or ``torch.float8_e4m3fn``) or ``"int8"`` (or
            ``torch.int8``) for rows quantized with a scale per (token, kv head), half the host
            and PCIe bytes of bf16. Quantized rows are made on the device where they are appended
            and dequantized on the device when a layer is attended, so the model still gets keys
            and values in ``dtype``: new tensors then, not views (2 x rows x heads x head size x
            its element size per layer's update, in torch's allocator, freed after that layer's
            attention). Windows and states stay in ``dtype``.
        static_shapes: True (the default): ``update`` returns all ``max_cache_len`` rows per
            batch row and ``get_mask_sizes`` answers ``(max_cache_len, 0)``, as transformers'
            StaticCache does: the model computes what it computes with StaticCache, logits bit
            for bit in every dtype, and a compiled decode step keeps its shapes, so
            ``CompileConfig(fullgraph=True, dynamic=False)`` compiles it once and a second
            ``generate`` with a new cache of the same shape reuses the graph (generate compiles
            on CUDA by itself, with CUDA graphs). Only the valid rows are copied; what it costs is
            attention over the masked rows past them (finite values: zeros, or rows of an earlier
            layer or step), ``max_cache_len`` keys per step instead of the valid ones. False:
            ``update`` returns the valid rows, one more every step, and attention reads only
            those, which is faster eagerly while the cache is mostly empty (a long
            ``max_cache_len`` with short generations), but in bf16 and fp16 a softmax over fewer
            columns rounds differently from StaticCache's and can flip a greedy token at a
            near-tie; compiled, the lengths become symbolic (``dynamic=None``) or every step
            recompiles (``dynamic=False``). None: True, but False for models whose forward
            insists on a cache class of their own (MiniMax), which mask the valid rows only.
        split: split attention at decode (kvoffload/hf_split.py): ``"auto"`` for a split row
            from the host's and the bus's rates measured now (as ``kvo-generate --split auto``),
            or a number of rows; None (the default): off. Each streamed layer of a decode step
            then leaves the rows before the split in host memory, attended there in place by
            the library's host attention while the device attends the rest, merged exactly;
            only the rows after the split cross the bus (``stats()``: ``split_rows_last``,
            ``split_bytes_saved``). It sets ``config``'s attention to kvoffload's split
            attention, which hands every layer that does not split to the attention the model
            had (``"sdpa"`` or ``"eager"``); a split layer attended by anything else is refused.

    Raises:
        UnsupportedModelError: the model has layers the cache cannot serve (named, with why).
        ValueError: a bad size, device or dtype. MemoryError: the plan does not fit the budget, or
            an allocation failed (the message names the bytes).
    """

    def __new__(cls, config, *args, **kwargs):
        _check_config(config)
        text_config = config.get_text_config(decoder=True)
        entry = _MODEL_CACHE_CLASSES.get(getattr(text_config, "model_type", None))
        if entry is not None:
            base = getattr(importlib.import_module(entry[0]), entry[1])
            if not issubclass(cls, base):
                key = (cls, base)
                if key not in _MIXED_CLASSES:
                    _MIXED_CLASSES[key] = type(cls.__name__, (cls, base), {"__doc__": cls.__doc__})
                cls = _MIXED_CLASSES[key]
        return super().__new__(cls)

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
        kv_dtype=None,
        static_shapes: bool | None = None,
        split=None,
    ):
        _check_config(config)
        if static_shapes is not None and not isinstance(static_shapes, bool):
            raise TypeError(f"static_shapes must be True, False or None, got {static_shapes!r}")
        split_mode, split_rows = _parse_split(split)
        text_config = config.get_text_config(decoder=True)
        self._text_config = text_config
        for name, value in (("max_batch_size", max_batch_size), ("max_cache_len", max_cache_len)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
            _check_int(name, value, 1, _INT32_MAX)
        _check_int("ring_depth", ring_depth, 1, 64)
        specs = describe_layers(text_config, max_cache_len)
        self.shard = _shard_of(config, text_config, specs)
        if self.shard.sharded:  # this rank's heads of every layer that keeps keys and values
            specs = [dataclasses.replace(s, kv=self._rank_layout(s)) if s.kv else s
                     for s in specs]
        self._specs = specs
        self.device = _resolve_device(device)
        own_cache_class = getattr(text_config, "model_type", None) in _MODEL_CACHE_CLASSES
        if static_shapes is None:
            static_shapes = not own_cache_class
        elif static_shapes and own_cache_class:
            raise ValueError(
                f"static_shapes=True is not supported for {text_config.model_type}: its forward "
                "builds masks for the valid rows only (it insists on a cache class of its own, "
                "which generate does not compile for); leave static_shapes unset")
        self.static_shapes = static_shapes
        self.dtype = _resolve_dtype(dtype, text_config)
        self.kv_dtype = _resolve_kv_dtype(kv_dtype, self.dtype)
        self._quantized = self.kv_dtype in ("fp8", "int8")
        self.max_batch_size = max_batch_size
        self.max_cache_len = max_cache_len
        offloaded = [s for s in specs if s.attention == OFFLOADED]
        kv = offloaded[0].kv if offloaded else None
        self.num_key_value_heads = kv.kv_heads if kv else None
        self.head_dim = kv.k_head_dim if kv else None

        element_size = torch.empty((), dtype=self.dtype).element_size()
        self._window_bytes = sum(s.window_bytes(max_batch_size, element_size) for s in specs)
        self._state_bytes = sum(s.state_bytes(max_batch_size, self.dtype) for s in specs)
        local_bytes = self._window_bytes + self._state_bytes
        budget = _parse_budget(vram_budget)
        if budget is not None and budget <= local_bytes:
            raise MemoryError(
                f"the budget is {_native.format_bytes(budget)}, and this model's windows and "
                f"states alone need {_native.format_bytes(local_bytes)} on the device "
                f"(windows {_native.format_bytes(self._window_bytes)}, states "
                f"{_native.format_bytes(self._state_bytes)}), before any full-attention layer"
            )
        if resident_layers is not None:
            _check_int("resident_layers", resident_layers, -_INT32_MAX, _INT32_MAX)
        if resident_layers is not None and not 0 <= resident_layers <= len(offloaded):
            raise ValueError(
                f"resident_layers must be in [0, {len(offloaded)}] (the model's full-attention "
                f"layers), got {resident_layers!r}"
            )
        backend = "host"
        if self.device.type == "cuda":
            backend = "cuda"
            if _native.cuda_device_count() == 0:
                raise ValueError(
                    f"device {self.device} asks for the CUDA backend, but this kvoffload build "
                    "has none (built without CUDA, or no usable GPU for it)"
                )

        # The native cache plans and allocates every byte of the offloaded layers now
        # (kvoffload/cache.hpp); the budget it gets is what the windows and states leave.
        self._native = None
        shape = None
        native_budget = 0 if budget is None else budget - local_bytes
        planned = -1 if resident_layers is None else int(resident_layers)
        if offloaded:
            shape = dict(layers=len(offloaded), kv_heads=kv.kv_heads, head_dim=kv.k_head_dim,
                         v_head_dim=kv.v_head_dim, max_seq=max_cache_len, slots=max_batch_size,
                         dtype=self.kv_dtype, ring_depth=ring_depth,
                         kv_head_begin=self.shard.kv_head_begin,
                         model_kv_heads=self.shard.model_kv_heads)
        node_bytes = 0  # measured by the native cache
        if self.shard.parallel:
            native_budget, planned, node_bytes = self._agree_on_plan(shape, native_budget,
                                                                     planned)
        failure = None
        if offloaded:
            try:
                self._native = _native.Cache(
                    **shape,
                    states_dtype=_DTYPES[self.dtype] if self._quantized else "",
                    backend=backend,
                    device=self.device.index or 0,
                    resident_layers=planned,
                    device_budget=native_budget,
                    static_shapes=static_shapes,
                    ranks_per_node=self.shard.ranks_per_node,
                    node_available_bytes=node_bytes,
                    split=split_mode,
                    split_rows=split_rows,
                )
            except Exception as error:  # every rank learns of it below
                failure = error
        hf_tp.all_succeeded(self.shard, self.device, failure, "allocate its cache")
        if offloaded:
            self._handle = hf_ops.register(self)
            granted = self._native.stats()["plan"]["resident_layers"]
            if resident_layers is not None and granted != resident_layers:
                # The native plan keeps every layer when the streamed ones would be no more than
                # the ring: their buffers would cost what keeping them does.
                warnings.warn(
                    f"resident_layers={resident_layers} became {granted}: streaming "
                    f"{len(offloaded) - resident_layers} layer(s) through a ring of {ring_depth} "
                    "buffers takes as much device memory as keeping them, so every layer stays "
                    "resident (plan()['resident_layers_requested'] keeps the request)",
                    stacklevel=2)
        self._resident_requested = resident_layers
        # Split attention: offloaded layers from this one on are streamed, and may split.
        self.split = split
        self._split_from = -1
        if split_mode != "off":
            if kv is not None and kv.v_head_dim != kv.k_head_dim:
                raise ValueError(
                    f"split attention needs values as wide as keys, and this model's are "
                    f"{kv.v_head_dim} and {kv.k_head_dim} wide")
            if self._native is not None:
                self._split_from = self._native.stats()["plan"]["resident_layers"]

        # Per model layer: its index among the offloaded layers (-1: kept here), its layer object.
        self._slot = [-1] * len(specs)
        layers = []
        for spec in specs:
            if spec.attention == OFFLOADED:
                self._slot[spec.index] = sum(1 for s in self._slot if s >= 0)
                layer = (OffloadedStateLayer(self, spec) if spec.states
                         else OffloadedLayer(self, spec.index))
            elif spec.attention == WINDOW:
                layer_class = WindowStateLayer if spec.states else WindowLayer
                layer = layer_class(spec, max_batch_size, self.device, self.dtype)
                if static_shapes:
                    layer.make_static()
            elif spec.states:
                layer = StateLayer(spec, max_batch_size, self.device, self.dtype)
            else:
                layer = DummyLayer()
            layers.append(layer)
        Cache.__init__(self, layers=layers)

        # Tokens per row: `_length` counts the forward in progress from its first key/value
        # layer on; `_open` holds until its last one, `_forward_tokens` is its token count.
        kv_layers = [s.index for s in specs if s.attention]
        self._first_kv_layer, self._last_kv_layer = kv_layers[0], kv_layers[-1]
        # With static shapes a compiled forward reads no Python length (dynamo would guard on it
        # and recompile every step): it counts in `_length_tensor` (a static address, as
        # transformers' StaticLayer.cumulative_length) and marks `_length_stale`; eager code then
        # reads the length back from the native cache, which always knows it.
        self._length_tensor = None
        if static_shapes:
            self._length_tensor = torch.zeros((), dtype=torch.long, device=self.device)
            torch._dynamo.mark_static_address(self._length_tensor)
        self._length_stale = False
        self._length = 0
        self._forward_tokens = 0
        self._open = False
        if self._split_from >= 0:  # streamed layers split: the model attends them through us
            streamed = [slot if slot >= self._split_from else -1 for slot in self._slot]
            hf_split.install(self._handle, streamed, config, text_config)

    def _rank_layout(self, spec) -> KvLayout:
        kv, world = spec.kv, self.shard.world_size
        if kv.kv_heads % world:
            raise TensorParallelError(
                f"layer {spec.index} has {kv.kv_heads} KV heads, which {world} tensor-parallel "
                "ranks do not share evenly")
        return dataclasses.replace(kv, kv_heads=kv.kv_heads // world)

    def _agree_on_plan(self, shape, budget: int, resident: int) -> tuple[int, int, int]:
        """Under tensor parallelism: the ranks' one plan. Each plans against its own budget (on
        CUDA without one, its device's free memory less the headroom the native cache keeps) and
        measures the node's available host memory before any rank allocates; then one
        all_reduce(MIN), issued by every rank, gives all of them the fewest resident layers any
        rank can hold and the least memory any measured, and checks that every rank asked for
        the same capacity. A rank whose plan failed sends -1, so that every rank raises rather
        than waits. Returns (budget, resident layers, the node's available bytes)."""
        failure = None
        mine = node = 0
        try:  # (KVO_HOST_MEMORY may be unreadable on one rank)
            node = min(_native.host_available_bytes(), 1 << 62)
        except Exception as error:  # every rank learns of it below
            failure, mine = error, -1
        if shape is not None and failure is None:
            try:
                if budget == 0 and self.device.type == "cuda":
                    free, total = torch.cuda.mem_get_info(self.device)
                    budget = _native.default_device_budget(free, total)
                    if budget == 0:
                        raise MemoryError(
                            f"rank {self.shard.rank}: the GPU has no memory free beyond the "
                            "headroom kept for cuBLAS, kernel modules and torch's tensors")
                plan = _native.plan(**shape, resident_layers=resident, device_budget=budget)
                mine = plan["resident_layers"]
            except Exception as error:  # every rank learns of it below
                failure, mine = error, -1
        capacity = [self.max_cache_len, self.max_batch_size, shape["ring_depth"] if shape else 0,
                    int(self._quantized)]
        lowest, highest = hf_tp.agree_range(self.shard, self.device, [mine, node] + capacity)
        if lowest[2:] != highest[2:]:
            raise TensorParallelError(
                f"the tensor-parallel ranks built caches of different sizes (max_cache_len, "
                f"max_batch_size, ring_depth, quantized from {lowest[2:]} to {highest[2:]}); "
                "every rank builds its cache with the same arguments")
        if failure is not None:
            raise failure
        if lowest[0] < 0:
            raise MemoryError(
                f"rank {self.shard.rank}: another tensor-parallel rank could not plan its cache "
                "(its own error says why); no rank built one")
        return budget, lowest[0], lowest[1]

    def __repr__(self) -> str:
        plan = self.plan()
        return (
            f"{type(self).__name__}(layers={len(self.layers)}, max_batch_size="
            f"{self.max_batch_size}, max_cache_len={self.max_cache_len}, device={self.device}, "
            f"dtype={self.dtype}, kv_dtype={self.kv_dtype}, "
            f"resident_layers={plan['resident_layers']}, "
            f"streamed_layers={plan['streamed_layers']}, window_layers={plan['window_layers']}, "
            f"state_layers={plan['state_layers']}, device_bytes={plan['device_bytes']}, "
            f"host_bytes={plan['host_bytes']})"
        )

    def __len__(self) -> int:
        return len(self.layers)

    # ---- the per-layer update ------------------------------------------------------------------

    def update(self, key_states, value_states, layer_idx: int, *args, **kwargs):
        """Stores this forward's keys and values of layer ``layer_idx`` and returns the ones to
        attend over (see the module docstring)."""
        layer_idx = self._layer_index(layer_idx)
        if layer_idx == self._first_kv_layer:
            for name, states in (("key_states", key_states), ("value_states", value_states)):
                if not isinstance(states, torch.Tensor):
                    raise TypeError(f"{name} must be a torch.Tensor, got {type(states).__name__}")
                if states.dim() != 4:
                    raise ValueError(f"{name} must be [batch, kv heads, tokens, head size], got "
                                     f"shape {tuple(states.shape)}")
            self._begin_forward(key_states, value_states, layer_idx)
        slot = self._slot[layer_idx]
        if slot >= 0:
            if torch.compiler.is_compiling():
                # Rows per batch row of the output, and rows between batch rows: max_cache_len
                # for both with static shapes; else the valid rows, and the buffer's
                # max_cache_len for views of it, the rows themselves for the new tensors of a
                # quantized cache.
                if self.static_shapes:
                    rows = between = self.max_cache_len
                else:
                    rows = self._length
                    between = rows if self._quantized else self.max_cache_len
                keys, values = torch.ops.kvoffload.update(
                    key_states, value_states, self._handle, slot, rows, between)
            else:
                keys, values = self._native.update(key_states, value_states, slot)
        else:
            layer = self.layers[layer_idx]
            if not isinstance(layer, WindowLayer):
                raise ValueError(
                    f"layer {layer_idx} ({self._specs[layer_idx].layer_type}) keeps no keys and "
                    "values in this cache, but the model stores some there"
                )
            keys, values = layer.update(key_states, value_states)
        if layer_idx == self._last_kv_layer:
            self._open = False
        return keys, values

    def _begin_forward(self, key_states, value_states, layer_idx: int) -> None:
        """At the first key/value layer of a forward: checks what users get wrong first, in their
        words (the native cache checks every layer again), then counts the forward's tokens."""
        if self._open:
            raise RuntimeError(
                f"a forward is starting while the previous one stopped before layer "
                f"{self._last_kv_layer} (after an error?): reset() the cache first"
            )
        tokens = key_states.shape[2]
        if self.static_shapes and torch.compiler.is_compiling():
            self._length_tensor.add_(tokens)
            self._length_stale = True
            self._forward_tokens = tokens
            self._open = True
            return
        if not torch.compiler.is_compiling():
            self._sync_length()
            self._check_states(key_states, value_states, layer_idx)
            if self._length + tokens > self.max_cache_len:
                raise ValueError(
                    f"the cache holds {self._length} tokens per row and this forward adds {tokens}: "
                    f"{self._length + tokens} would pass max_cache_len={self.max_cache_len}. Build "
                    "the cache with max_cache_len >= prompt length + max_new_tokens - 1 (the last "
                    "new token is never cached; the cache is allocated once and never grows), or "
                    "reset() it between generations"
                )
        self._length += tokens
        if self._length_tensor is not None:
            self._length_tensor.fill_(self._length)
        self._forward_tokens = tokens
        self._open = True

    def _sync_length(self) -> None:
        """After compiled forwards with static shapes: the Python length, from the native cache
        (the windows' own counts advanced in those forwards as they do eagerly)."""
        if self._length_stale and not self._open:
            self._length = self._native.get_seq_length() if self._native is not None else int(
                self._length_tensor)
            self._length_stale = False
            for layer in self.layers:
                if isinstance(layer, WindowLayer):
                    layer.set_seen(self._length)

    def _set_length(self, length: int) -> None:
        self._length = length
        self._length_stale = False
        if self._length_tensor is not None:
            self._length_tensor.fill_(length)

    def _check_states(self, key_states, value_states, layer_idx: int) -> None:
        kv = self._specs[layer_idx].kv
        for name, states, head_dim in (("key_states", key_states, kv.k_head_dim),
                                       ("value_states", value_states, kv.v_head_dim)):
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
            if states.dim() != 4 or tuple(states.shape[1::2]) != (kv.kv_heads, head_dim):
                raise ValueError(
                    f"layer {layer_idx}: {name} have shape {tuple(states.shape)}, and kvoffload "
                    f"read [batch, {kv.kv_heads} (kv heads), tokens, {head_dim} (head size)] from "
                    f"the {self._text_config.model_type} config; it reads this model's layout "
                    "wrongly (kvoffload/hf_layers.py: kv_layout)"
                )
        batch = key_states.shape[0]
        if batch > self.max_batch_size:
            raise ValueError(
                f"the batch has {batch} rows but the cache was built for max_batch_size="
                f"{self.max_batch_size}; build it with max_batch_size={batch}"
            )

    # ---- transformers' Cache interface -----------------------------------------------------------

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Tokens per row, counting the current forward's once its first key/value layer was
        updated (inside a compiled forward with static shapes: a 0-d tensor holding it)."""
        if self.static_shapes and torch.compiler.is_compiling():
            return self._length_tensor
        self._sync_length()
        return self._length

    def get_max_length(self, layer_idx: int | None = None) -> int:
        return self.max_cache_len

    def get_max_cache_shape(self, layer_idx: int = 0) -> int:
        """The name transformers 4.x used for get_max_length."""
        return self.max_cache_len

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        _check_int("query_length", query_length, 0, _INT32_MAX)
        layer = self.layers[self._layer_index(layer_idx)]
        self._sync_length()
        if isinstance(layer, WindowLayer):
            return layer.get_mask_sizes(query_length)
        if self._slot[layer_idx] < 0:  # no keys and values: as transformers, the first such layer
            return self.get_mask_sizes(query_length, self._first_kv_layer)
        if self.static_shapes:  # every row of the buffer, as transformers' StaticLayer
            return self.max_cache_len, 0
        # One mask column per key update returns: the tokens before this forward, plus its own.
        # Right also when asked in the middle of a forward, before a layer's update.
        before = self._length - self._forward_tokens if self._open else self._length
        return before + query_length, 0

    def get_conv_state(self, layer_idx: int, state_idx: int = 0):
        return self._state_layer(layer_idx).conv_state(state_idx)

    def get_recurrent_state(self, layer_idx: int, state_idx: int = 0):
        return self._state_layer(layer_idx).recurrent_state(state_idx)

    def update_conv_state(self, conv_states, layer_idx: int, state_idx: int = 0, **kwargs):
        return self._state_layer(layer_idx).update_conv_state(conv_states, state_idx, **kwargs)

    def update_recurrent_state(self, recurrent_states, layer_idx: int, state_idx: int = 0,
                               **kwargs):
        return self._state_layer(layer_idx).update_recurrent_state(recurrent_states, state_idx)

    # MiniMax's lightning attention (MiniMaxCache's interface).
    def get_linear_cache(self, layer_idx: int):
        return self._state_layer(layer_idx).linear_state()

    def set_linear_cache(self, layer_idx: int, linear_cache) -> None:
        self._state_layer(layer_idx).set_linear_state(linear_cache)

    def _layer_index(self, layer_idx) -> int:
        """``layer_idx`` checked: an int naming one of the model's layers. A negative one would
        index from the end (Python's lists do) and so alias another layer's rows."""
        if isinstance(layer_idx, bool) or not isinstance(layer_idx, int):
            raise TypeError(f"layer_idx must be an int, not {type(layer_idx).__name__}")
        if not 0 <= layer_idx < len(self.layers):
            raise IndexError(
                f"layer_idx {layer_idx} is out of range: the model has {len(self.layers)} layers "
                f"(0 to {len(self.layers) - 1})"
            )
        return layer_idx

    def _state_layer(self, layer_idx: int) -> StateLayer:
        layer = self.layers[self._layer_index(layer_idx)]
        if not isinstance(layer, StateLayer):
            raise ValueError(
                f"layer {layer_idx} ({self._specs[layer_idx].layer_type}) keeps no state in this "
                "cache, but the model reads or stores one there"
            )
        return layer

    def reset(self) -> None:
        """Empties every row (lengths back to 0, states zeroed); drops a forward left half-done
        by an error."""
        if self._native is not None:
            self._native.reset()
        for layer in self.layers:
            if isinstance(layer, (WindowLayer, StateLayer)):
                layer.reset()
        self._set_length(0)
        self._forward_tokens = 0
        self._open = False

    @property
    def is_croppable(self) -> bool:
        return all(getattr(layer, "is_croppable", True) for layer in self.layers)

    def crop(self, tokens_to_remove: int) -> None:
        """Drops the last ``-tokens_to_remove`` tokens of every row (a negative int, as for
        transformers' static layers; 0 does nothing). Refused when a layer cannot restore them: a
        state, or a window that already dropped the tokens before them."""
        _check_int("tokens_to_remove", tokens_to_remove, -_INT32_MAX, _INT32_MAX)
        if tokens_to_remove > 0:
            raise ValueError(
                "crop takes a negative int, the number of tokens to remove, as transformers' "
                f"static caches do; got {tokens_to_remove}"
            )
        if tokens_to_remove == 0:
            return
        self._sync_length()
        removed = min(-tokens_to_remove, self._length)
        for layer in self.layers:
            if isinstance(layer, (WindowLayer, StateLayer)) and not layer.is_croppable:
                layer.crop(removed)  # raises, naming the layer
        if self._native is not None:
            self._native.truncate(self._length - removed)
        for layer in self.layers:
            if isinstance(layer, WindowLayer):
                layer.crop(removed)
        self._set_length(self._length - removed)
        self._forward_tokens = 0
        self._open = False

    def _refuse(self, what: str):
        raise NotImplementedError(
            f"kvoffload's OffloadedStaticCache does not support {what}: its rows are fixed slots "
            "that advance together (use greedy decoding or sampling, num_beams=1)"
        )

    def reorder_cache(self, beam_idx) -> None:
        """Beam search: row i takes the rows of row ``beam_idx[i]`` (a 1-D integer tensor or
        list, as transformers passes it), in every layer: the offloaded ones in the native cache
        (moved in place: resident rows on the device, streamed ones in host memory;
        ``stats()['reorder_bytes']`` counts them), windows and states here. Rows past
        ``len(beam_idx)`` keep theirs."""
        source = [int(i) for i in (beam_idx.tolist() if hasattr(beam_idx, "tolist") else beam_idx)]
        rows = len(source)
        if not 0 < rows <= self.max_batch_size or not all(0 <= i < rows for i in source):
            raise ValueError(
                f"reorder_cache: beam_idx must hold one row index in [0, {rows}) per row, at "
                f"most max_batch_size={self.max_batch_size} rows; got {source}")
        if source == list(range(rows)):
            return
        if self._open:
            raise RuntimeError("reorder_cache inside a forward: reorder between forwards")
        if self._native is not None:
            self._native.reorder(source + list(range(rows, self.max_batch_size)))
        for layer in self.layers:
            if isinstance(layer, (WindowLayer, StateLayer)):
                for buffer in layer.buffers():
                    index = torch.tensor(source, device=buffer.device)
                    buffer[:rows].copy_(buffer.index_select(0, index))

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._refuse("repeating rows (batch_repeat_interleave)")

    def batch_select_indices(self, indices) -> None:
        self._refuse("selecting rows (batch_select_indices)")

    def activate_past_recording(self):
        """Assisted decoding and prompt lookup call this before they crop rejected draft tokens.
        Full-attention layers keep every row in place, so crop already restores them; a window
        or state layer that cannot restore what a crop asks for refuses in crop, naming itself."""
        for layer in self.layers:
            if hasattr(layer, "activate_past_recording"):
                layer.activate_past_recording()

    @property
    def is_compileable(self) -> bool:
        # generate compiles a CUDA forward with CUDA graphs (mode "reduce-overhead"), which need
        # shapes that do not change: static shapes give them. Without, this cache returns exactly
        # the valid rows, one more each step, and the graphs would be recorded again every step;
        # on the CPU the lengths become symbolic instead. A model with a cache class of its own
        # (MiniMax) builds its masks only for caches that generate does not compile for.
        if isinstance(self, self._own_cache_classes()):
            return False
        return self.static_shapes or self.device.type == "cpu"

    @classmethod
    def _own_cache_classes(cls) -> tuple:
        return tuple(base for (_, base) in _MIXED_CLASSES)

    # ---- kvoffload's own ---------------------------------------------------------------------

    @property
    def backend(self) -> str:
        """"cuda" or "host"."""
        return self._native.backend if self._native is not None else (
            "cuda" if self.device.type == "cuda" else "host")

    def device_buffers(self) -> list[torch.Tensor]:
        """The window and state buffers kept here (the offloaded layers' are the native cache's)."""
        return [b for layer in self.layers if hasattr(layer, "buffers") for b in layer.buffers()]

    def stats(self) -> dict[str, Any]:
        """Counters of the native cache (kvoffload/cache.hpp: CacheStats): steps,
        h2d_bytes_total, d2h_bytes_total, h2d/d2h_bytes_last_step, acquire_wait_s,
        prefetch_reissues, device_allocations (fixed after construction), and ``plan()``; with
        split attention, ``split_rows_last`` (the last split's rows per batch row) and
        ``split_bytes_saved`` (bytes the splits kept off the bus: the rows before each split,
        K and V, of every layer that split)."""
        if self._native is None:
            counters = dict.fromkeys(
                ("steps", "h2d_bytes_total", "d2h_bytes_total", "h2d_bytes_last_step",
                 "d2h_bytes_last_step", "prefetch_reissues", "device_allocations"), 0)
            counters["acquire_wait_s"] = 0.0
        else:
            self._native.get_seq_length()  # commits a complete forward, so the counters include it
            counters = self._native.stats()
        counters["plan"] = self.plan()
        return counters

    def plan(self) -> dict[str, Any]:
        """Where the bytes are. The offloaded layers' plan (kvoffload/plan.hpp: resident/streamed
        layers, ring_depth, row/tensor/layer bytes, resident_bytes, staging_bytes, host_bytes,
        budget), plus ``window_layers``/``window_bytes`` and ``state_layers``/``state_bytes`` kept
        here; ``device_bytes`` counts all of them (the native arena, windows and states)."""
        if self._native is not None:
            plan = dict(self._native.stats()["plan"])
        else:
            plan = dict.fromkeys(
                ("layers", "resident_layers", "streamed_layers", "ring_depth", "row_bytes",
                 "tensor_bytes", "layer_bytes", "resident_bytes", "staging_bytes",
                 "reserved_bytes", "device_bytes", "host_bytes", "budget", "ranks_per_node",
                 "host_share_bytes"), 0)
        plan["offloaded_layers"] = plan.pop("layers")
        plan["resident_layers_requested"] = self._resident_requested
        plan["layers"] = len(self._specs)
        plan["offloaded_device_bytes"] = plan["device_bytes"]
        plan["window_layers"] = sum(1 for s in self._specs if s.attention == WINDOW)
        plan["window_bytes"] = self._window_bytes
        plan["state_layers"] = sum(1 for s in self._specs if s.states)
        plan["state_bytes"] = self._state_bytes
        plan["device_bytes"] += self._window_bytes + self._state_bytes
        shard = self.shard
        plan["rank"], plan["world_size"] = shard.rank, shard.world_size
        plan["ranks_per_node"] = shard.ranks_per_node
        plan["kv_heads_sharded"] = shard.sharded
        plan["kv_head_begin"] = shard.kv_head_begin
        plan["kv_heads"] = shard.kv_heads
        plan["model_kv_heads"] = shard.model_kv_heads
        return plan

    # ---- saved contexts ------------------------------------------------------------------------

    def _check_saveable(self) -> None:
        if self._native is None or self._window_bytes or self._state_bytes:
            raise ValueError(
                "saved contexts hold the rows of full-attention layers, and this model also keeps "
                "windows or states on the device, which the file does not hold"
            )

    def save(self, path, tokens=None, *, model, tokenizer=None) -> None:
        """Saves every row (its keys and values in every layer, and its length) to ``path``,
        written atomically, with the K/V dtype and the fingerprint of ``model``, the model whose
        forward filled the cache (kvoffload/hf_fingerprint.py: its whole config, a digest of its
        weights as loaded, how they were loaded, and with ``tokenizer``, its directory or a
        tokenizer loaded from one, the tokenizer's files); each layer's rows carry a checksum.
        ``tokens``: the ids each row holds (a list per row, or one list for a single row), kept
        in the file and returned by ``load``; more lists than rows are refused. A forward left
        half-done is refused, and so is a model with window or state layers.

        Under tensor parallelism every rank calls it with the same ``path``. With KV heads
        sharded each rank writes its own file, ``saved_context_path(path, rank, world_size)``
        (``path.rank{r}of{w}``), naming its rank, the world size and its heads; with attention
        replicated (the same rows on every rank: multi-head latent attention) rank 0 alone writes
        ``path``. It returns on every rank once every file is written."""
        path = _check_path(path)
        hf_fingerprint.check_model(model, "save")
        self._check_saveable()
        if tokens is not None and tokens and isinstance(tokens[0], int):
            tokens = [tokens]
        tokens = [[_check_int("a token id", i, 0, _INT32_MAX) for i in t] for t in (tokens or [])]
        if len(tokens) > self.max_batch_size:
            raise ValueError(f"tokens holds {len(tokens)} lists of ids, and the cache has "
                             f"{self.max_batch_size} row(s); nothing was saved")
        # On every rank: the weights' digest gathers a tensor-parallel model's shards.
        fingerprint = hf_fingerprint.model_fingerprint(model, self.head_dim, self.shard, tokenizer,
                                                       self.device)
        failure = None
        if self.shard.sharded or self.shard.rank == 0:
            try:
                self._native.save(saved_context_path(path, self.shard), tokens, fingerprint)
            except Exception as error:  # every rank learns of it below
                failure = error
        # Every rank returns once every file is written, or raises.
        hf_tp.all_succeeded(self.shard, self.device, failure, "write its saved context")

    @classmethod
    def load(cls, path, model, device=None, dtype=None, vram_budget=None,
             resident_layers: int | None = None, ring_depth: int = 2,
             static_shapes: bool | None = None, tokenizer=None) -> "OffloadedStaticCache":
        """A new cache holding the rows saved in ``path`` (no prefill), for ``model``:
        max_batch_size and max_cache_len come from the file, which must have been saved from
        the same model (its config, its weights as loaded, how they were loaded, and the
        tokenizer where ``save`` was given one: pass the same ``tokenizer`` here) and K/V dtype;
        anything else is refused naming the first field that differs and both values, and a
        truncated or corrupted file naming the failing layer block. ``cache.saved_tokens``
        holds each row's token ids. Continue with ``model.generate(full_ids, cache=cache)``:
        transformers feeds only the ids past ``cache.get_seq_length()``.

        Under tensor parallelism every rank calls it with the ``path`` given to ``save``, and
        each reads its own rank's file (or, attention replicated, ``path``, which any world size
        reads); a context of sharded heads saved under another world size, or by a single
        process, is refused on every rank, naming both world sizes (a rank never restores
        another rank's heads), and so are rank files whose rows differ in count or length."""
        path = _check_path(path)
        config = hf_fingerprint.check_model(model, "load").config
        text_config = config.get_text_config(decoder=True)
        shard = _shard_of(config, text_config, describe_layers(text_config, _INT32_MAX))
        info, failure = None, None
        try:
            info = _inspect_for(path, shard)
        except Exception as error:  # every rank learns of it below
            failure = error
        # Every rank reads its file or every rank raises: none waits.
        on = torch.device("cpu") if device is None else torch.device(device)
        hf_tp.all_succeeded(shard, on, failure, f"read its saved context of {path}", ValueError)
        # What the ranks' files must share: rows per slot, max_seq and every slot's length.
        sizes = [len(info["lengths"]), info["max_seq"],
                 zlib.crc32(repr(info["lengths"]).encode()) & 0x7FFFFFFF]
        lowest, highest = hf_tp.agree_range(shard, on, sizes)
        if lowest != highest:
            raise ValueError(
                f"{path}: the ranks' saved contexts hold different slots, max_seq or lengths "
                "(were they saved together? a save that failed on one rank leaves the others' "
                "files newer)")
        kv_dtype = None
        if info["dtype"] in _QUANTIZED:  # quantized rows: the model computes in `dtype`
            kv_dtype = info["dtype"]
        elif dtype is None:
            dtype = {v: k for k, v in _DTYPES.items()}[info["dtype"]]
        cache = cls(config, max_batch_size=len(info["lengths"]), max_cache_len=info["max_seq"],
                    device=device, dtype=dtype, vram_budget=vram_budget,
                    resident_layers=resident_layers, ring_depth=ring_depth, kv_dtype=kv_dtype,
                    static_shapes=static_shapes)
        cache._check_saveable()
        failure = None
        try:  # a corrupted block is found only now, on its rank alone
            fingerprint = hf_fingerprint.model_fingerprint(model, cache.head_dim, shard,
                                                           tokenizer, cache.device)
            cache.saved_tokens = cache._native.load(saved_context_path(path, shard),
                                                    fingerprint)
        except Exception as error:
            failure = error
        hf_tp.all_succeeded(shard, cache.device, failure, f"restore its saved context of {path}")
        cache._set_length(cache._native.get_seq_length())
        cache._open = False
        return cache


def saved_context_path(path: str, shard) -> str:
    """The file a process saves to and loads from: its rank's where its KV heads are sharded,
    else ``path`` itself."""
    return f"{path}.rank{shard.rank}of{shard.world_size}" if shard.sharded else path


def _world_of(model_text: str) -> tuple[int, int] | None:
    """(rank, world size) a saved context's fingerprint names, or None (saved by one process).
    The rank's line a sharded cache writes first ("kv_heads_held=...") is passed over."""
    fields = dict(line.split("=", 1) for line in model_text.splitlines() if "=" in line)
    try:
        if "tp.rank" in fields:
            return int(fields["tp.rank"]), int(fields["tp.world_size"])
        return int(fields["tp_rank"]), int(fields["tp_world_size"])  # an older fingerprint
    except (KeyError, ValueError):
        return None


def _inspect_for(path: str, shard) -> dict:
    """The headers of the file this rank restores, after refusing, in words, a context saved
    under another world size or rank (the native cache checks the heads again)."""
    here = (f"rank {shard.rank} of a world size of {shard.world_size}" if shard.sharded
            else "one process (world size 1)" if not shard.parallel
            else f"{shard.world_size} ranks holding every KV head")
    target = saved_context_path(path, shard)
    if not os.path.exists(target):
        directory, base = os.path.split(os.path.abspath(path))
        rank_file = re.compile(re.escape(base) + r"\.rank(\d+)of(\d+)")
        others = sorted(n for n in os.listdir(directory) if rank_file.fullmatch(n)) \
            if os.path.isdir(directory) else []
        worlds = sorted({rank_file.fullmatch(n).group(2) for n in others})
        if shard.sharded and worlds == [str(shard.world_size)]:
            raise ValueError(
                f"{target}: no such saved context, though other ranks' files of {path} are there "
                f"({', '.join(others[:4])}): rank {shard.rank}'s file is missing")
        if others:
            raise ValueError(
                f"{path} was saved under tensor parallelism with a world size of "
                f"{' or '.join(worlds)} (files {', '.join(others[:4])}), and this is {here}: "
                "load it with the world size it was saved with; nothing was loaded")
        if shard.sharded and os.path.exists(path):
            raise ValueError(
                f"{path} was saved by one process (world size 1), and this is {here}: load it "
                "with the world size it was saved with; nothing was loaded")
        raise ValueError(f"{target}: no such saved context")
    info = _native.inspect_saved_context(target)
    saved = _world_of(info["models"][0]) if info["models"] else None
    mine = (shard.rank, shard.world_size) if shard.sharded else None
    if saved != mine:
        was = (f"rank {saved[0]} of a world size of {saved[1]}" if saved
               else "one process (world size 1)")
        raise ValueError(f"{target} was saved by {was}, and this is {here}; nothing was loaded")
    return info
