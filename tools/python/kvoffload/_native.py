"""kvoffload._native: the native cache and the library's helpers, for kvoffload.hf, over the C ABI
(kvoffload/_capi.py). Tensors cross by pointer, strides and stream; what the cache returns are
zero-copy views of its buffers, handed to torch as DLPack capsules, made once per buffer.

``Cache`` maps transformers' update() calls onto the per-step protocol of kvoffload.h, as the
LibTorch adapter (include/kvoffload/torch.hpp) does for C++ engines:

    update(k, v, 0)      ends the previous step if one is open (release of its last layer,
                         end_step), begin_step(n for every row of the batch, 0 past it),
                         acquire(0), append the rows of every batch row
    update(k, v, l > 0)  release(l - 1) (the caller's attention on l - 1 is enqueued by now),
                         acquire(l), append
    get_seq_length(), reset(), end_step()   end (or, for reset, abort) the open step

update returns, for each of K and V, [batch, kv_heads, rows, head_dim] with strides [slot_stride,
head_stride, token_stride, 1] over the cache's device buffer: rows = len + n (the valid rows), or
max_seq with static shapes. Quantized K/V (fp8, int8): the new rows are quantized on their device
with the arithmetic of kvoffload/quant.hpp, in torch operations, and the rows returned are new
tensors of the caller's dtype, dequantized on the device; with static shapes zero past len + n.

Rows of the batch are the cache's first slots and all sit at the same position. Tensors: CPU
tensors on the host backend, CUDA tensors of the cache's device on the CUDA backend; on CUDA the
work is ordered on the current torch stream at each update, and a layer is released on the stream
of its own update. Errors are those of kvoffload/_capi.py; a refused call changes nothing.
"""

from __future__ import annotations

import ctypes as C
import math
import weakref

import torch

from . import _capi
from ._capi import lib

__all__ = ["Cache", "TensorBytes", "bytes_digest", "cuda_device_count", "default_device_budget",
           "fingerprint", "fingerprint_number", "format_bytes", "host_available_bytes",
           "inspect_saved_context", "parse_size", "plan", "tokenizer_digest", "weights_digest"]

# ---- the library's helpers -------------------------------------------------------------------


def parse_size(text: str) -> int:
    """Bytes in a size such as '24GiB', '512MiB', '1.5GB' or '4096'."""
    out = C.c_uint64()
    _capi.check(lib.kvo_parse_size(text.encode(), C.byref(out)))
    return out.value


def format_bytes(count: int) -> str:
    return _capi.text(lib.kvo_format_bytes, count)


def host_available_bytes() -> int:
    """What this machine can give the pinned store (kvoffload/plan.hpp)."""
    out = C.c_uint64()
    _capi.check(lib.kvo_host_available_bytes(C.byref(out)))
    return out.value


def default_device_budget(free_bytes: int, total_bytes: int) -> int:
    """The budget a CUDA cache with none takes: free memory less max(1 GiB, 5% of total)."""
    out = C.c_uint64()
    _capi.check(lib.kvo_default_device_budget(free_bytes, total_bytes, C.byref(out)))
    return out.value


def cuda_device_count() -> int:
    """Usable CUDA devices for the library (0 when built without CUDA or without a driver)."""
    out = C.c_int32()
    _capi.check(lib.kvo_cuda_device_count(C.byref(out)))
    return out.value


def _options(layers, kv_heads, head_dim, max_seq, slots, dtype, resident_layers, ring_depth,
             device_budget, v_head_dim, kv_head_begin, model_kv_heads, ranks_per_node=1,
             node_available_bytes=0, backend="host", device=0, host_max_delay_us=0,
             host_delay_seed=0, split="off", split_rows=0) -> _capi.Options:
    if dtype not in _capi.DTYPES:
        raise ValueError(f"dtype is one of {', '.join(_capi.DTYPES)}, not {dtype!r}")
    if backend not in _capi.BACKENDS:
        raise ValueError(f"backend is one of {', '.join(_capi.BACKENDS)}, not {backend!r}")
    options = _capi.Options()
    _capi.check(lib.kvo_cache_options_init(C.byref(options), C.sizeof(options)))
    options.layers, options.kv_heads, options.head_dim = layers, kv_heads, head_dim
    options.v_head_dim, options.max_seq, options.slots = v_head_dim, max_seq, slots
    options.dtype = _capi.DTYPES[dtype]
    options.resident_layers, options.ring_depth = resident_layers, ring_depth
    options.device_budget = device_budget
    options.kv_head_begin, options.model_kv_heads = kv_head_begin, model_kv_heads
    options.ranks_per_node, options.node_available_bytes = ranks_per_node, node_available_bytes
    options.backend, options.device = _capi.BACKENDS[backend], device
    options.host_max_delay_us, options.host_delay_seed = host_max_delay_us, host_delay_seed
    options.split_mode, options.split_rows = _capi.SPLIT_MODES[split], split_rows
    return options


def _plan_dict(stats: _capi.Stats) -> dict:
    return {name: getattr(stats, name) for name in _capi.PLAN}


def plan(layers, kv_heads, head_dim, max_seq, slots, dtype, resident_layers, ring_depth,
         device_budget, v_head_dim=0, kv_head_begin=0, model_kv_heads=0) -> dict:
    """The plan a cache of these arguments would get under device_budget (0: unlimited),
    allocating nothing."""
    options = _options(layers, kv_heads, head_dim, max_seq, slots, dtype, resident_layers,
                       ring_depth, device_budget, v_head_dim, kv_head_begin, model_kv_heads)
    stats = _capi.Stats(struct_size=C.sizeof(_capi.Stats))
    _capi.check(lib.kvo_plan(C.byref(options), C.byref(stats)))
    return _plan_dict(stats)


def inspect_saved_context(path: str) -> dict:
    """What a saved-context file holds, from its headers alone."""
    info = _capi.SavedContextInfo(struct_size=C.sizeof(_capi.SavedContextInfo))
    encoded = path.encode()
    _capi.check(lib.kvo_inspect_saved_context(encoded, C.byref(info), None, 0))
    lengths = (C.c_int32 * max(info.records, 1))()
    _capi.check(lib.kvo_inspect_saved_context(encoded, C.byref(info), lengths, info.records))
    return {"layers": info.layers, "kv_heads": info.kv_heads, "head_dim": info.head_dim,
            "v_head_dim": info.v_head_dim, "max_seq": info.max_seq,
            "dtype": _capi.DTYPE_NAMES[info.dtype], "lengths": list(lengths[:info.records]),
            "models": [_capi.text(lib.kvo_saved_context_model, encoded, r)
                       for r in range(info.records)]}


def fingerprint_number(value: float) -> str:
    """A finite number in the fingerprint's canonical text."""
    return _capi.text(lib.kvo_fingerprint_number, float(value))


def fingerprint(fields: dict) -> str:
    """The fingerprint of these fields (each value its text)."""
    keys = (C.c_char_p * max(len(fields), 1))(*(k.encode() for k in fields))
    values = (C.c_char_p * max(len(fields), 1))(*(v.encode() for v in fields.values()))
    return _capi.text(lib.kvo_fingerprint_text, keys, values, len(fields))


def bytes_digest(data: int, count: int) -> str:
    """The digest of `count` host bytes at address `data` (a tensor's bytes)."""
    return _capi.text(lib.kvo_digest_bytes, data, count)


class TensorBytes:
    """The digest of bytes fed in pieces."""

    def __init__(self):
        handle = C.c_void_p()
        _capi.check(lib.kvo_bytes_digest_create(C.byref(handle)))
        self._handle = handle.value
        self._finalizer = weakref.finalize(self, lib.kvo_bytes_digest_destroy, handle.value)

    def update(self, data: int, count: int) -> None:
        _capi.check(lib.kvo_bytes_digest_update(self._handle, data, count))

    def digest(self) -> str:
        return _capi.text(lib.kvo_bytes_digest_hex, self._handle)


def weights_digest(tensors) -> str:
    """The weights' digest of (name, dtype, shape, bytes' digest) tuples, in any order."""
    handle = C.c_void_p()
    _capi.check(lib.kvo_weights_digest_create(C.byref(handle)))
    try:
        for name, dtype, shape, digest in tensors:
            dims = (C.c_int64 * max(len(shape), 1))(*shape)
            _capi.check(lib.kvo_weights_digest_add(handle, name.encode(), dtype.encode(), dims,
                                                   len(shape), digest.encode()))
        return _capi.text(lib.kvo_weights_digest_hex, handle)
    finally:
        lib.kvo_weights_digest_destroy(handle)


def tokenizer_digest(directory: str) -> str:
    """The digest of a tokenizer's files in directory, '' when it has none."""
    return _capi.text(lib.kvo_tokenizer_digest, directory.encode())


# ---- views of the cache's buffers as torch tensors (DLPack) -----------------------------------


class _DLDevice(C.Structure):
    _fields_ = [("device_type", C.c_int32), ("device_id", C.c_int32)]


class _DLDataType(C.Structure):
    _fields_ = [("code", C.c_uint8), ("bits", C.c_uint8), ("lanes", C.c_uint16)]


class _DLTensor(C.Structure):
    _fields_ = [("data", C.c_void_p), ("device", _DLDevice), ("ndim", C.c_int32),
                ("dtype", _DLDataType), ("shape", C.POINTER(C.c_int64)),
                ("strides", C.POINTER(C.c_int64)), ("byte_offset", C.c_uint64)]


_DELETER = C.CFUNCTYPE(None, C.c_void_p)


class _DLManagedTensor(C.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", C.c_void_p), ("deleter", _DELETER)]


# DLPack's (type code, bits) of each element type a view can have.
_DL_TYPES = {torch.float32: (2, 32), torch.float16: (2, 16), torch.bfloat16: (4, 16),
             torch.uint8: (1, 8)}
_KDL_CPU, _KDL_CUDA = 1, 2

# Every DLManagedTensor torch holds, by address: kept alive until torch calls its deleter.
_HELD: dict = {}


@_DELETER
def _release_view(address):
    _HELD.pop(address, None)


_capsule_new = C.pythonapi.PyCapsule_New
_capsule_new.restype = C.py_object
_capsule_new.argtypes = [C.c_void_p, C.c_char_p, C.c_void_p]


def _view(address: int, dtype: torch.dtype, device: torch.device, shape, strides) -> torch.Tensor:
    """A tensor over `address` (device memory the cache owns) with these shape and strides
    (elements), without a copy."""
    managed = _DLManagedTensor()
    dims = (C.c_int64 * len(shape))(*shape)
    steps = (C.c_int64 * len(strides))(*strides)
    code, bits = _DL_TYPES[dtype]
    managed.dl_tensor = _DLTensor(
        address,
        _DLDevice(_KDL_CUDA if device.type == "cuda" else _KDL_CPU, device.index or 0),
        len(shape), _DLDataType(code, bits, 1), dims, steps, 0)
    managed.deleter = _release_view
    key = C.addressof(managed)
    _HELD[key] = (managed, dims, steps)
    return torch.utils.dlpack.from_dlpack(_capsule_new(key, b"dltensor", None))


# ---- quantized K/V: the arithmetic of kvoffload/quant.hpp in torch operations -----------------

_MAX_CODE = {"fp8": 448.0, "int8": 127.0}


def _quantize_rows(rows: torch.Tensor, dtype: str, row_bytes: int) -> torch.Tensor:
    """rows [batch, n, kv_heads, dim] (contiguous, any float dtype) as quantized rows [batch, n,
    row_bytes] (uint8) on their device, to the bits of kvo::quantize_row for finite inputs. Every
    division is by a tensor on the rows' device."""
    batch, n, heads, dim = rows.shape
    x = rows.to(torch.float32)
    top = torch.full((1,), _MAX_CODE[dtype], dtype=torch.float32, device=x.device)
    scale = x.abs().amax(-1, keepdim=True) / top  # [batch, n, heads, 1]
    scaled = torch.where(scale > 0, x / scale, torch.zeros_like(x))
    if dtype == "int8":
        codes = scaled.round().clamp(-127, 127).to(torch.int8).view(torch.uint8)  # ties to even
    else:
        codes = scaled.clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)
    out = torch.zeros((batch, n, row_bytes), dtype=torch.uint8, device=x.device)
    out[:, :, :heads * dim].copy_(codes.reshape(batch, n, heads * dim))
    scale_offset = row_bytes - 4 * heads
    out[:, :, scale_offset:].view(torch.float32).copy_(scale.reshape(batch, n, heads))
    return out


def _dequantize_rows(bytes_view: torch.Tensor, heads: int, dim: int, scale_offset: int,
                     stored: str, dtype: torch.dtype) -> torch.Tensor:
    """Quantized rows [batch, rows, row bytes] (uint8) as values [batch, heads, rows, dim] of
    `dtype`: decode(byte) * scale in f32, as kvo::dequantize_row, then rounded to `dtype`."""
    batch, length, _ = bytes_view.shape
    codes = (bytes_view[:, :, :heads * dim]
             .view(torch.int8 if stored == "int8" else torch.float8_e4m3fn)
             .to(torch.float32).view(batch, length, heads, dim))
    scales = bytes_view[:, :, scale_offset:scale_offset + 4 * heads].view(torch.float32)
    return (codes * scales.unsqueeze(-1)).to(dtype).permute(0, 2, 1, 3)


# ---- the cache -----------------------------------------------------------------------------

_STATES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def _destroy(handle: int, cuda: bool, last_stream: list) -> None:
    # The caller's kernels may still read a view of this cache's memory.
    if cuda:
        lib.kvo_stream_synchronize(handle, last_stream[0])
    lib.kvo_cache_destroy(handle)


class Cache:
    """The native cache behind kvoffload.hf (see the module docstring). Plans and allocates every
    byte now; raises ValueError for bad arguments, MemoryError when the plan does not fit."""

    def __init__(self, layers, kv_heads, head_dim, max_seq, slots, dtype, backend, device=0,
                 resident_layers=_capi.AUTO_RESIDENT_LAYERS, ring_depth=2, device_budget=0,
                 host_max_delay_us=0, host_delay_seed=0, v_head_dim=0, states_dtype="",
                 static_shapes=False, kv_head_begin=0, model_kv_heads=0, ranks_per_node=1,
                 node_available_bytes=0, split="off", split_rows=0):
        quantized = dtype in _MAX_CODE
        if quantized and states_dtype not in _STATES:
            raise ValueError(f"a cache of {dtype} K/V quantizes keys and values computed in f32, "
                             f"f16 or bf16 and returns them in that dtype: give it as "
                             f"states_dtype (got {states_dtype or 'none'})")
        if not quantized and states_dtype not in ("", dtype):
            raise ValueError(f"the cache stores {dtype} keys and values, which update() takes "
                             f"and returns as they are: states_dtype must be {dtype} (or ''), "
                             f"not {states_dtype}")
        options = _options(layers, kv_heads, head_dim, max_seq, slots, dtype, resident_layers,
                           ring_depth, device_budget, v_head_dim, kv_head_begin, model_kv_heads,
                           ranks_per_node, node_available_bytes, backend, device,
                           host_max_delay_us, host_delay_seed, split, split_rows)
        handle = C.c_void_p()
        _capi.check(lib.kvo_cache_create(C.byref(options), C.byref(handle)))
        self._handle = handle.value
        kind = C.c_int()
        self._check(lib.kvo_cache_backend(self._handle, C.byref(kind)))
        self.backend = _capi.BACKEND_NAMES[kind.value]
        cuda = self.backend == "cuda"
        self._last_stream = [None]
        self._finalizer = weakref.finalize(self, _destroy, self._handle, cuda, self._last_stream)

        self._device = torch.device("cuda", device) if cuda else torch.device("cpu")
        self._stored = dtype
        self._quantized = quantized
        self._dtype = _STATES[states_dtype or dtype]
        self._static_shapes = static_shapes
        self._layers, self._slots, self._max_seq = layers, slots, max_seq
        self._kv_heads, self._head_dim = kv_heads, head_dim
        self._v_head_dim = v_head_dim or head_dim
        row_bytes = C.c_uint64()
        for width, name in ((head_dim, "_k_row_bytes"), (self._v_head_dim, "_v_row_bytes")):
            _capi.check(lib.kvo_row_bytes(_capi.DTYPES[dtype], kv_heads, width,
                                          C.byref(row_bytes)))
            setattr(self, name, row_bytes.value)
        self._view = _capi.View(struct_size=C.sizeof(_capi.View))
        self._view_ref = C.byref(self._view)
        self._cuda = cuda
        self._k_heads_dim = torch.Size((kv_heads, head_dim))
        self._v_heads_dim = torch.Size((kv_heads, self._v_head_dim))
        self._views: dict = {}  # (k, v) addresses -> their whole-buffer tensors
        self._new_tokens = (C.c_int32 * slots)()
        self._in_step = False
        self._held_layer = -1  # acquired and not yet released
        self._step_tokens = 0  # n of the open step
        self._step_batch = 0  # rows of the open step: slots [0, step_batch)
        self._step_length = 0  # rows each of them held before the open step
        self._held_stream = None  # the stream the held layer was updated on
        # Split attention: the held layer's split rows per batch row (None: it does not split),
        # the layer whose split rows no attend() has read yet (-1: none), and what splits saved.
        self._split = split != "off"
        self._split_rows = None
        self._split_pending = -1
        self._split_saved = 0
        self._split_last = []
        self._split_keys = None  # what update() of the held layer returned (split caches)
        self._host_attention: dict = {}  # (heads, scale, softcap) -> kvo_host_attention_t

    def _check(self, status: int) -> None:
        if status != _capi.OK:
            _capi.raise_for(status, self._handle)

    def _length(self, slot: int) -> int:
        out = C.c_int32()
        self._check(lib.kvo_length(self._handle, slot, C.byref(out)))
        return out.value

    def _stream(self):
        if not self._cuda:
            return None  # the host backend: synchronous, like CPU tensors
        return torch.cuda.current_stream(self._device).cuda_stream or None

    def _check_states(self, states, name: str, head_dim: int, layer: int) -> None:
        where = f"update of layer {layer}: "
        if not isinstance(states, torch.Tensor):
            raise ValueError(where + f"{name} is a {type(states).__name__}, not a tensor")
        if states.dtype != self._dtype:
            raise ValueError(where + f"{name} has dtype {states.dtype}, the cache stores "
                             f"{self._dtype}")
        if states.device != self._device:
            raise ValueError(where + f"{name} is on {states.device}, the cache is on "
                             f"{self._device} (the {self.backend} backend)")
        shape = states.shape
        if (len(shape) != 4 or not 1 <= shape[0] <= self._slots or shape[1] != self._kv_heads
                or shape[2] < 1 or shape[3] != head_dim):
            raise ValueError(where + f"{name} has shape {list(shape)}, expected [1.."
                             f"{self._slots} (batch <= slots), {self._kv_heads} (kv_heads), "
                             f"n >= 1 (tokens), {head_dim} (head_dim)]")

    def _begin(self, batch: int, n: int) -> int:
        """At layer 0: checks the step can start and returns the length it starts from (the
        same for every row of the batch); changes nothing."""
        committed = self._length(0)
        for s in range(1, batch):
            if self._length(s) != committed:
                raise RuntimeError(
                    f"update: rows of the batch hold different lengths (slot 0: {committed}, "
                    f"slot {s}: {self._length(s)}); the cache keeps every row at the same "
                    "position")
        if self._in_step and self._held_layer != self._layers - 1:
            raise RuntimeError(
                f"update of layer 0 while the open step has updated only layers [0, "
                f"{self._held_layer + 1}) of {self._layers} (every layer is updated once per "
                "step, in order; reset() drops the step)")
        length = committed + (self._step_tokens if self._in_step else 0)
        if length + n > self._max_seq:
            raise ValueError(f"update: {n} more tokens after {length} would pass "
                             f"max_cache_len ({self._max_seq})")
        return length

    def _continue(self, layer: int, batch: int, n: int) -> None:
        """At a layer after 0: checks it is the step's next one, with layer 0's rows."""
        if not self._in_step:
            raise RuntimeError(f"update of layer {layer} before layer 0 of a step (layers "
                               "are updated in order 0, 1, ...)")
        if layer != self._held_layer + 1:
            expected = ("every layer of the step was updated; layer 0 starts the next"
                        if self._held_layer + 1 == self._layers
                        else f"expected layer {self._held_layer + 1}")
            raise RuntimeError(f"update of layer {layer} out of order: {expected}")
        if n != self._step_tokens:
            raise ValueError(f"update of layer {layer} with {n} tokens, but layer 0 of this "
                             f"step had {self._step_tokens}")
        if batch != self._step_batch:
            raise ValueError(f"update of layer {layer} with a batch of {batch} rows, but "
                             f"layer 0 of this step had {self._step_batch}")

    def update(self, key_states, value_states, layer: int):
        """Appends key_states and value_states, each [batch, kv_heads, n, head_dim], as rows
        [len, len + n) of layer `layer`, and returns the (keys, values) to attend over."""
        # Every check runs before anything changes; the common case costs a few comparisons.
        if not 0 <= layer < self._layers:
            raise ValueError(f"update: layer_idx {layer} is out of range (the cache has "
                             f"{self._layers} layers)")
        k_shape = getattr(key_states, "shape", None)
        v_shape = getattr(value_states, "shape", None)
        if (k_shape is None or v_shape is None or len(k_shape) != 4 or len(v_shape) != 4
                or key_states.dtype != self._dtype or value_states.dtype != self._dtype
                or key_states.device != self._device or value_states.device != self._device
                or k_shape[1:2] + k_shape[3:] != self._k_heads_dim
                or v_shape[1:2] + v_shape[3:] != self._v_heads_dim
                or not 1 <= k_shape[0] <= self._slots or k_shape[2] < 1):
            self._check_states(key_states, "key_states", self._head_dim, layer)
            self._check_states(value_states, "value_states", self._v_head_dim, layer)
        batch, n = k_shape[0], k_shape[2]
        if v_shape[0] != batch or v_shape[2] != n:
            raise ValueError(f"update of layer {layer}: key_states {list(k_shape)} and "
                             f"value_states {list(v_shape)} differ in batch or tokens")
        if self._split_pending >= 0:
            raise RuntimeError(
                f"update of layer {layer}: layer {self._split_pending} split its keys between "
                "host and device memory, and nothing attended it through kvoffload's split "
                "attention (its staged rows before the split are not its keys): the model's "
                "attention is not the one OffloadedStaticCache(split=...) set; reset() the cache")
        starts_step = layer == 0
        if starts_step:
            length = self._begin(batch, n)
        else:
            self._continue(layer, batch, n)
            length = self._step_length

        # Appends take each row [n][kv_heads][head_dim] contiguous, as the cache stores it
        # (quantized: [n][row bytes], made here on the tensors' device).
        k_rows = key_states.transpose(1, 2).contiguous()
        v_rows = value_states.transpose(1, 2).contiguous()
        if self._quantized:
            k_rows = _quantize_rows(k_rows, self._stored, self._k_row_bytes)
            v_rows = _quantize_rows(v_rows, self._stored, self._v_row_bytes)
        stream = self._stream()
        handle = self._handle
        if starts_step:
            if self._in_step:
                self._check(lib.kvo_release(handle, self._held_layer, self._held_stream))
                self._check(lib.kvo_end_step(handle))
                self._in_step = False
            for s in range(self._slots):
                self._new_tokens[s] = n if s < batch else 0
            self._check(lib.kvo_begin_step(handle, self._new_tokens, self._slots))
            self._in_step = True
            self._step_tokens, self._step_batch, self._step_length = n, batch, length
        else:
            self._check(lib.kvo_release(handle, self._held_layer, self._held_stream))
        self._held_layer = -1
        self._check(lib.kvo_acquire(handle, layer, self._view_ref, stream))
        self._held_layer = layer
        self._held_stream = stream
        self._last_stream[0] = stream
        k_base, v_base = k_rows.data_ptr(), v_rows.data_ptr()
        if batch == 1:
            self._check(lib.kvo_append(handle, layer, 0, k_base, v_base, n, stream))
        else:
            k_step = k_rows.stride(0) * k_rows.element_size()
            v_step = v_rows.stride(0) * v_rows.element_size()
            for s in range(batch):
                self._check(lib.kvo_append(handle, layer, s, k_base + s * k_step,
                                           v_base + s * v_step, n, stream))

        view = self._view
        if self._split:
            self._split_rows = None
            if view.split_rows:  # a streamed layer of a decode step that splits
                self._split_rows = [view.split_rows[s] for s in range(batch)]
                self._split_pending = layer
                self._split_saved += sum(self._split_rows) * (self._k_row_bytes +
                                                             self._v_row_bytes)
                self._split_last = self._split_rows
        rows = self._max_seq if self._static_shapes else length + n  # returned per batch row
        keys, values = self._buffers(view)
        if self._quantized:
            valid = length + n
            keys = _dequantize_rows(keys[:batch, :valid], self._kv_heads, self._head_dim,
                                    view.k_scale_offset, self._stored, self._dtype)
            values = _dequantize_rows(values[:batch, :valid], self._kv_heads, self._v_head_dim,
                                      view.v_scale_offset, self._stored, self._dtype)
            if rows != valid:  # zero rows after the valid ones, token-major as they are
                keys, values = (torch.nn.functional.pad(t.permute(0, 2, 1, 3),
                                                        (0, 0, 0, 0, 0, rows - valid))
                                .permute(0, 2, 1, 3) for t in (keys, values))
        elif batch != self._slots or rows != self._max_seq:
            keys, values = keys[:batch, :, :rows], values[:batch, :, :rows]
        if self._split:
            self._split_keys = keys
        return keys, values

    def _buffers(self, view):
        """The whole buffers a view names as tensors, made the first time a buffer is seen (the
        cache's buffers are static: its resident layers and its staging ring)."""
        key = (view.k, view.v)
        found = self._views.get(key)
        if found is None:
            if self._quantized:  # bytes: [slots, max_seq, row bytes]
                found = (_view(view.k, torch.uint8, self._device,
                               (self._slots, self._max_seq, self._k_row_bytes),
                               (view.slot_stride, view.token_stride, 1)),
                         _view(view.v, torch.uint8, self._device,
                               (self._slots, self._max_seq, self._v_row_bytes),
                               (view.v_slot_stride, view.v_token_stride, 1)))
            else:  # [slots, kv_heads, max_seq, head_dim] over the NHD buffer
                found = (_view(view.k, self._dtype, self._device,
                               (self._slots, self._kv_heads, self._max_seq, self._head_dim),
                               (view.slot_stride, view.head_stride, view.token_stride, 1)),
                         _view(view.v, self._dtype, self._device,
                               (self._slots, self._kv_heads, self._max_seq, self._v_head_dim),
                               (view.v_slot_stride, view.v_head_stride, view.v_token_stride,
                                1)))
            self._views[key] = found
        return found

    def get_seq_length(self) -> int:
        """Tokens the cache holds, counting the open step's; ends the open step first when
        every layer of it was updated."""
        if self._in_step and self._held_layer == self._layers - 1:
            self.end_step()
        length = self._length(0)
        if self._in_step:
            length += self._step_tokens  # layer 0 already holds the open step's rows
        return length

    def get_max_cache_shape(self) -> int:
        return self._max_seq

    def reset(self) -> None:
        """Empties every row: aborts an open step, lengths back to 0."""
        self._split_pending = -1
        self._split_rows = None
        self._split_keys = None
        if self._in_step:
            stream = self._held_stream if self._held_layer >= 0 else self._stream()
            self._check(lib.kvo_abort_step(self._handle, stream))
            self._in_step = False
            self._held_layer = -1
            self._step_tokens = self._step_batch = 0
        for s in range(self._slots):
            self._check(lib.kvo_reset_slot(self._handle, s))

    def end_step(self) -> None:
        """Ends the open step (every layer updated): releases the last layer and commits."""
        if not self._in_step:
            return
        if self._held_layer != self._layers - 1:
            raise RuntimeError(f"end_step after updating only layers [0, "
                               f"{self._held_layer + 1}) of {self._layers}; reset() drops the "
                               "step")
        self._check(lib.kvo_release(self._handle, self._held_layer, self._held_stream))
        self._check(lib.kvo_end_step(self._handle))
        self._last_stream[0] = self._held_stream
        self._in_step = False
        self._held_layer = -1
        self._step_tokens = self._step_batch = 0

    def truncate(self, length: int) -> None:
        """Drops the last rows of every slot (commits the open step first, which must be
        complete)."""
        self.end_step()
        for s in range(self._slots):
            self._check(lib.kvo_truncate_slot(self._handle, s, length))

    def reorder(self, source) -> None:
        """Beam search: slot s takes slot source[s]'s rows (commits the open step first)."""
        self.end_step()
        self._check(lib.kvo_reorder_slots(self._handle, _capi.int32_array(source), len(source)))

    def save(self, path: str, tokens, model: str) -> None:
        """Every slot, in order, to one file (written atomically), with each slot's token ids
        (lists for the first slots; the rest none)."""
        self.end_step()
        if len(tokens) > self._slots:
            raise ValueError(f"tokens has {len(tokens)} rows, and the cache holds "
                             f"{self._slots}; nothing was saved")
        counts = [len(tokens[s]) if s < len(tokens) else 0 for s in range(self._slots)]
        ids = [i for row in tokens for i in row]
        self._check(lib.kvo_save_slots(self._handle, _capi.int32_array(range(self._slots)),
                                       self._slots, path.encode(), _capi.int32_array(ids),
                                       _capi.int32_array(counts), model.encode()))

    def load(self, path: str, model: str) -> list:
        """Replaces every slot (an open step is dropped first) and returns each slot's token
        ids."""
        self.end_step()
        capacity = self._slots * self._max_seq
        ids = (C.c_int32 * capacity)()
        counts = (C.c_int32 * self._slots)()
        self._check(lib.kvo_load_slots(self._handle, _capi.int32_array(range(self._slots)),
                                       self._slots, path.encode(), model.encode(), ids, capacity,
                                       counts))
        out, begin = [], 0
        for count in counts:
            out.append(list(ids[begin:begin + count]))
            begin += count
        return out

    def stats(self) -> dict:
        stats = _capi.Stats(struct_size=C.sizeof(_capi.Stats))
        self._check(lib.kvo_stats(self._handle, C.byref(stats)))
        out = {name: getattr(stats, name) for name in _capi.COUNTERS}
        out["plan"] = _plan_dict(stats)
        if self._split:
            out["split_rows_last"] = list(self._split_last)
            out["split_bytes_saved"] = self._split_saved
        return out

    def returned(self, layer: int, keys) -> bool:
        """Whether `keys` are what update() of the held layer `layer` returned this step (the
        same memory and shape: compiled code hands on new tensor objects), so that attend()
        attends them."""
        mine = self._split_keys
        return (self._in_step and layer == self._held_layer and mine is not None
                and keys.data_ptr() == mine.data_ptr() and keys.shape == mine.shape
                and keys.stride() == mine.stride())

    def attended(self) -> None:
        """The held layer, which did not split, was attended by the model's own attention."""
        self._split_keys = None

    def splits_now(self) -> bool:
        """Whether the held layer split its keys this step."""
        return self._split_rows is not None

    def _host_attention_for(self, heads: int, scale: float, softcap: float) -> int:
        key = (heads, scale, softcap)
        handle = self._host_attention.get(key)
        if handle is None:
            out = C.c_void_p()
            _capi.check(lib.kvo_host_attention_create(
                heads, self._kv_heads, self._head_dim, _capi.DTYPES[self._stored], self._slots,
                0, scale, softcap, C.byref(out)))
            handle = out.value
            weakref.finalize(self, lib.kvo_host_attention_destroy, handle)
            self._host_attention[key] = handle
        return handle

    def attend(self, query, keys, values, mask, layer: int, scale: float, cap: float,
               sinks=None):
        """Split attention of the held layer `layer` for a decode step: query [batch, heads, 1,
        head_dim] over keys [0, len + 1) of each batch row, the rows before the split in the host
        store (the library's host attention, in place) and the rest in keys and values (what
        update returned), merged by their log-sum-exps. scale: of the scores; cap: their soft cap
        (0: none). mask: the model's mask (bool, True where a key is seen, or additive floats;
        None: every valid key is seen); sinks: per head, a
        logit each row's softmax also counts (gpt-oss), or None. Returns the output [batch, 1,
        heads, head_dim] in the query's dtype, as transformers' attention functions do."""
        if layer != self._held_layer:
            raise RuntimeError(f"attend of layer {layer}, but layer {self._held_layer} is held")
        self._split_pending = -1
        self._split_keys = None
        batch, heads, n, _ = query.shape
        valid = self._step_length + n
        cuts = self._split_rows if self._split_rows is not None else [0] * batch
        cut = cuts[0]
        if any(c != cut for c in cuts):
            raise RuntimeError(f"layer {layer} split its batch rows at different rows {cuts}")
        out, lse, seen_before = device_part(query, keys[:batch, :, cut:valid],
                                            values[:batch, :, cut:valid], mask, cut, valid,
                                            scale, cap)
        if cut > 0:
            begin = [0] * batch
            if seen_before is not None:
                seen = seen_before.cpu()
                for b in range(batch):
                    row = seen[b]
                    first = int(row.int().argmax()) if bool(row.any()) else cut
                    if not bool(row[first:].all()):
                        raise ValueError(
                            f"layer {layer}: the attention mask of batch row {b} hides keys "
                            f"among rows [{first}, {cut}) that split attention reads in host "
                            "memory; it takes masks that hide a prefix (left padding) only")
                    begin[b] = first
            q = query[:, :, -1, :].float().cpu().contiguous()  # [batch, heads, dim]
            host_out = torch.empty_like(q)
            host_lse = torch.empty((batch, heads), dtype=torch.float32)
            handle = self._host_attention_for(heads, scale, cap)
            _capi.check(lib.kvo_host_attention_run(
                handle, self._view_ref, q.data_ptr(), batch, _capi.int32_array(range(batch)),
                _capi.int32_array(begin), _capi.int32_array(cuts), host_out.data_ptr(),
                host_lse.data_ptr()))
            host_lse = (host_lse * math.log(2.0)).to(query.device)[:, :, None, None]
            host_out = host_out.to(query.device)[:, :, None, :]
            merged = torch.logaddexp(lse, host_lse)
            out = out * torch.exp(lse - merged) + host_out * torch.exp(host_lse - merged)
            lse = merged
        return finish(out, lse, sinks, query.dtype)


def device_part(query, keys, values, mask, first: int, end: int, scale: float, cap: float):
    """Attention of query [batch, heads, n, dim] over keys and values [batch, kv_heads, L, dim]
    (the rows [first, end) of the mask's columns), in f32, each kv head's group of query heads
    at once (no copy of the keys per head). Returns (out [batch, heads, n, dim], lse [batch, heads,
    n, 1] in natural log, the mask's columns [0, first) of the last query, as bool, or None)."""
    batch, heads, n, dim = query.shape
    kv_heads = keys.shape[1]
    group = heads // kv_heads
    q = query.float().reshape(batch, kv_heads, group * n, dim)
    k, v = keys.float(), values.float()
    scores = torch.matmul(q, k.transpose(-1, -2)).view(batch, heads, n, -1) * scale
    if cap:
        scores = torch.tanh(scores / cap) * cap
    seen_before = None
    if mask is not None:
        columns = mask[:, :, :, :end].expand(batch, -1, -1, -1)
        if columns.dtype == torch.bool:
            scores = scores.masked_fill(~columns[..., first:], float("-inf"))
            seen_before = columns[:, 0, -1, :first]
        else:
            scores = scores + columns[..., first:].float()
            seen_before = columns[:, 0, -1, :first] == 0
    lse = torch.logsumexp(scores, dim=-1, keepdim=True)
    weights = torch.softmax(scores, dim=-1).view(batch, kv_heads, group * n, -1)
    out = torch.matmul(weights, v).view(batch, heads, n, dim)
    return out, lse, seen_before


def finish(out, lse, sinks, dtype):
    """out [batch, heads, n, dim] normalized over its keys, with their lse: with sinks (a logit
    per head the softmax also counts) scaled down by their share; [batch, n, heads, dim] in
    `dtype`."""
    if sinks is not None:
        sink = sinks.float().to(out.device).view(1, -1, 1, 1)
        out = out * torch.exp(lse - torch.logaddexp(lse, sink))
    return out.to(dtype).transpose(1, 2).contiguous()


def plain_attention(query, keys, values, mask, scale: float, cap: float, sinks=None):
    """Attention over every row of keys and values as a cache returned them (no split): what
    kvoffload::attend runs for a layer whose keys are not a split cache's."""
    batch = query.shape[0]
    out, lse, _ = device_part(query, keys[:batch], values[:batch], mask, 0, keys.shape[2], scale,
                              cap)
    return finish(out, lse, sinks, query.dtype)
