"""The C ABI of libkvoffload (include/kvoffload/kvoffload.h) through ctypes: the library the
package carries, its structs, its calls' prototypes, and its statuses as Python exceptions.

Nothing here imports torch: the shared library links no torch and no Python, so one build serves
every torch and every Python. The library is, in order:

- the file ``KVOFFLOAD_LIBRARY`` names (an engine's own build of libkvoffload.so.0);
- ``libkvoffload.so.0`` beside this file (the wheel, and the build tree's package).

Statuses: KVO_ERROR_INVALID_ARGUMENT raises ValueError, KVO_ERROR_OUT_OF_MEMORY MemoryError, every
other failure RuntimeError; the message is the library's (kvo_last_error), unchanged.
"""

from __future__ import annotations

import ctypes as C
import os

# The oldest library this package runs against: the C ABI it calls first appeared in 0.5.
ABI_FLOOR = (0, 5)

OK, INVALID_ARGUMENT, PROTOCOL, OUT_OF_MEMORY, DEVICE, INTERNAL = range(6)
DTYPES = {"f32": 0, "f16": 1, "bf16": 2, "fp8": 3, "int8": 4}
DTYPE_NAMES = {number: name for name, number in DTYPES.items()}
BACKENDS = {"auto": 0, "cuda": 1, "host": 2}
BACKEND_NAMES = {number: name for name, number in BACKENDS.items()}
SPLIT_MODES = {"off": 0, "auto": 1, "rows": 2}
AUTO_RESIDENT_LAYERS = -1


class Options(C.Structure):
    _fields_ = [
        ("struct_size", C.c_uint32), ("layers", C.c_int32), ("kv_heads", C.c_int32),
        ("head_dim", C.c_int32), ("max_seq", C.c_int32), ("slots", C.c_int32),
        ("dtype", C.c_int), ("resident_layers", C.c_int32), ("ring_depth", C.c_int32),
        ("device_budget", C.c_uint64), ("backend", C.c_int), ("device", C.c_int32),
        ("host_max_delay_us", C.c_uint32), ("host_delay_seed", C.c_uint64),
        ("v_head_dim", C.c_int32), ("layer_windows", C.POINTER(C.c_int32)),
        ("max_append", C.c_int32), ("split_mode", C.c_int), ("split_rows", C.c_int32),
        ("split_h2d_bytes_per_s", C.c_double), ("split_host_bytes_per_s", C.c_double),
        ("kv_head_begin", C.c_int32), ("model_kv_heads", C.c_int32),
        ("ranks_per_node", C.c_int32), ("node_available_bytes", C.c_uint64),
    ]


class View(C.Structure):
    _fields_ = [
        ("struct_size", C.c_uint32), ("layer", C.c_int32), ("resident", C.c_int32),
        ("k", C.c_void_p), ("v", C.c_void_p), ("slot_stride", C.c_int64),
        ("token_stride", C.c_int64), ("head_stride", C.c_int64), ("slots", C.c_int32),
        ("max_seq", C.c_int32), ("kv_heads", C.c_int32), ("head_dim", C.c_int32),
        ("dtype", C.c_int), ("lengths", C.POINTER(C.c_int32)),
        ("new_tokens", C.POINTER(C.c_int32)), ("v_slot_stride", C.c_int64),
        ("v_token_stride", C.c_int64), ("v_head_stride", C.c_int64), ("v_head_dim", C.c_int32),
        ("k_scale_offset", C.c_int64), ("v_scale_offset", C.c_int64), ("window", C.c_int32),
        ("first_positions", C.POINTER(C.c_int32)), ("split_rows", C.POINTER(C.c_int32)),
        ("host_k", C.c_void_p), ("host_v", C.c_void_p),
    ]


# kvo_cache_stats: (name, ctypes type) in the header's order; the plan's fields are a cache's plan.
_STATS_FIELDS = (
    [("steps", C.c_uint64), ("h2d_bytes_total", C.c_uint64), ("d2h_bytes_total", C.c_uint64),
     ("h2d_bytes_last_step", C.c_uint64), ("d2h_bytes_last_step", C.c_uint64),
     ("acquire_wait_s", C.c_double), ("prefetch_reissues", C.c_uint64),
     ("device_allocations", C.c_uint64), ("resident_layers", C.c_int32),
     ("streamed_layers", C.c_int32), ("ring_depth", C.c_int32), ("row_bytes", C.c_uint64),
     ("layer_bytes", C.c_uint64), ("resident_bytes", C.c_uint64),
     ("staging_bytes", C.c_uint64), ("device_bytes", C.c_uint64), ("host_bytes", C.c_uint64),
     ("budget", C.c_uint64), ("v_row_bytes", C.c_uint64), ("reorder_bytes", C.c_uint64),
     ("window_layers", C.c_int32), ("window_bytes", C.c_uint64),
     ("split_h2d_bytes_per_s", C.c_double), ("split_host_bytes_per_s", C.c_double),
     ("kv_head_begin", C.c_int32), ("model_kv_heads", C.c_int32), ("ranks_per_node", C.c_int32),
     ("host_share_bytes", C.c_uint64), ("layers", C.c_int32), ("tensor_bytes", C.c_uint64),
     ("reserved_bytes", C.c_uint64)])
COUNTERS = ("steps", "h2d_bytes_total", "d2h_bytes_total", "h2d_bytes_last_step",
            "d2h_bytes_last_step", "acquire_wait_s", "prefetch_reissues", "reorder_bytes",
            "device_allocations")
PLAN = ("layers", "resident_layers", "streamed_layers", "ring_depth", "row_bytes",
        "tensor_bytes", "layer_bytes", "resident_bytes", "staging_bytes", "reserved_bytes",
        "device_bytes", "host_bytes", "budget", "kv_head_begin", "model_kv_heads",
        "ranks_per_node", "host_share_bytes")


class Stats(C.Structure):
    _fields_ = [("struct_size", C.c_uint32)] + _STATS_FIELDS


class SavedContextInfo(C.Structure):
    _fields_ = [("struct_size", C.c_uint32), ("layers", C.c_int32), ("kv_heads", C.c_int32),
                ("head_dim", C.c_int32), ("v_head_dim", C.c_int32), ("max_seq", C.c_int32),
                ("dtype", C.c_int), ("records", C.c_int32)]


_P = C.c_void_p
_I32 = C.c_int32
_I32P = C.POINTER(C.c_int32)
_U64 = C.c_uint64
_U64P = C.POINTER(C.c_uint64)
_SIZE = C.c_size_t
_SIZEP = C.POINTER(C.c_size_t)
_STR = C.c_char_p
_TEXT = [C.c_char_p, _SIZE, _SIZEP]  # a text result: buffer, capacity, out_length

# name -> argument types; every one returns a kvo_status unless listed in _RESULTS.
_PROTOTYPES = {
    "kvo_version": [],
    "kvo_status_name": [C.c_int],
    "kvo_last_error": [_P],
    "kvo_cuda_device_count": [_I32P],
    "kvo_row_bytes": [C.c_int, _I32, _I32, _U64P],
    "kvo_parse_size": [_STR, _U64P],
    "kvo_format_bytes": [_U64] + _TEXT,
    "kvo_host_available_bytes": [_U64P],
    "kvo_default_device_budget": [_U64, _U64, _U64P],
    "kvo_plan": [C.POINTER(Options), C.POINTER(Stats)],
    "kvo_inspect_saved_context": [_STR, C.POINTER(SavedContextInfo), _I32P, _I32],
    "kvo_saved_context_model": [_STR, _I32] + _TEXT,
    "kvo_fingerprint_number": [C.c_double] + _TEXT,
    "kvo_fingerprint_text": [C.POINTER(C.c_char_p), C.POINTER(C.c_char_p), _I32] + _TEXT,
    "kvo_digest_bytes": [_P, _U64] + _TEXT,
    "kvo_bytes_digest_create": [C.POINTER(_P)],
    "kvo_bytes_digest_update": [_P, _P, _U64],
    "kvo_bytes_digest_hex": [_P] + _TEXT,
    "kvo_bytes_digest_destroy": [_P],
    "kvo_weights_digest_create": [C.POINTER(_P)],
    "kvo_weights_digest_add": [_P, _STR, _STR, C.POINTER(C.c_int64), _I32, _STR],
    "kvo_weights_digest_hex": [_P] + _TEXT,
    "kvo_weights_digest_destroy": [_P],
    "kvo_tokenizer_digest": [_STR] + _TEXT,
    "kvo_cache_options_init": [C.POINTER(Options), C.c_uint32],
    "kvo_cache_create": [C.POINTER(Options), C.POINTER(_P)],
    "kvo_cache_destroy": [_P],
    "kvo_cache_backend": [_P, C.POINTER(C.c_int)],
    "kvo_begin_step": [_P, _I32P, _I32],
    "kvo_acquire": [_P, _I32, C.POINTER(View), _P],
    "kvo_append": [_P, _I32, _I32, _P, _P, _I32, _P],
    "kvo_release": [_P, _I32, _P],
    "kvo_end_step": [_P],
    "kvo_abort_step": [_P, _P],
    "kvo_reset_slot": [_P, _I32],
    "kvo_truncate_slot": [_P, _I32, _I32],
    "kvo_reorder_slots": [_P, _I32P, _I32],
    "kvo_length": [_P, _I32, _I32P],
    "kvo_save_slots": [_P, _I32P, _I32, _STR, _I32P, _I32P, _STR],
    "kvo_load_slots": [_P, _I32P, _I32, _STR, _STR, _I32P, C.c_int64, _I32P],
    "kvo_stats": [_P, C.POINTER(Stats)],
    "kvo_stream_synchronize": [_P, _P],
    "kvo_host_attention_create": [_I32, _I32, _I32, C.c_int, _I32, _I32, C.c_float, C.c_float,
                                  C.POINTER(_P)],
    "kvo_host_attention_run": [_P, C.POINTER(View), _P, _I32, _I32P, _I32P, _I32P, _P, _P],
    "kvo_host_attention_destroy": [_P],
}
_RESULTS = {"kvo_version": C.c_char_p, "kvo_status_name": C.c_char_p,
            "kvo_last_error": C.c_char_p, "kvo_cache_destroy": None,
            "kvo_host_attention_destroy": None,
            "kvo_bytes_digest_destroy": None, "kvo_weights_digest_destroy": None}


def library_path() -> str:
    """The libkvoffload.so.0 this package loads (see the module docstring)."""
    given = os.environ.get("KVOFFLOAD_LIBRARY")
    if given:
        if not os.path.isfile(given):
            raise ImportError(f"KVOFFLOAD_LIBRARY={given} names no file")
        return given
    beside = os.path.join(os.path.dirname(os.path.abspath(__file__)), "libkvoffload.so.0")
    if not os.path.isfile(beside):
        raise ImportError(
            f"kvoffload's native library is not at {beside}: install the package with pip (it "
            "builds the library), or set KVOFFLOAD_LIBRARY to a libkvoffload.so.0")
    return beside


def _load(path: str) -> C.CDLL:
    lib = C.CDLL(path)  # CDLL: every call releases the GIL
    for name, argtypes in _PROTOTYPES.items():
        try:
            function = getattr(lib, name)
        except AttributeError:
            raise ImportError(f"{path} has no {name}: it is older than this package, which "
                              f"needs the C ABI of kvoffload {ABI_FLOOR[0]}.{ABI_FLOOR[1]} or "
                              "newer") from None
        function.argtypes = argtypes
        function.restype = _RESULTS.get(name, C.c_int)
    version = lib.kvo_version().decode()
    major, minor = (int(part) for part in version.split(".")[:2])
    if major != ABI_FLOOR[0] or minor < ABI_FLOOR[1]:
        raise ImportError(f"{path} is kvoffload {version}; this package needs "
                          f"{ABI_FLOOR[0]}.{ABI_FLOOR[1]} or a newer {ABI_FLOOR[0]}.x")
    return lib


PATH = library_path()
lib = _load(PATH)
VERSION = lib.kvo_version().decode()


def raise_for(status: int, cache=None) -> None:
    """Raises the exception a failed call's status stands for (nothing for KVO_OK)."""
    if status == OK:
        return
    message = lib.kvo_last_error(cache).decode(errors="replace")
    if status == INVALID_ARGUMENT:
        raise ValueError(message)
    if status == OUT_OF_MEMORY:
        raise MemoryError(message)
    raise RuntimeError(message)


def check(status: int) -> None:
    """raise_for, for calls without a cache."""
    if status != OK:
        raise_for(status)


def text(function, *args) -> str:
    """The text result of `function(*args, buffer, capacity, out_length)` (kvoffload.h)."""
    length = C.c_size_t(0)
    buffer = C.create_string_buffer(256)
    check(function(*args, buffer, len(buffer), C.byref(length)))
    if length.value >= len(buffer):
        buffer = C.create_string_buffer(length.value + 1)
        check(function(*args, buffer, len(buffer), C.byref(length)))
    return buffer.raw[:length.value].decode()


def int32_array(values) -> C.Array:
    values = list(values)
    return (C.c_int32 * max(len(values), 1))(*values)
