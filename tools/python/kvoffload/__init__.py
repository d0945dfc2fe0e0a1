"""kvoffload: an offloaded static KV cache for long-context decoding.

The full-length K/V of every streamed layer lives in (pinned) host memory and is streamed layer by
layer through a small ring of device buffers; only each layer's valid prefix moves host->device
and only the rows a step appends move back. Every byte is allocated once, when the cache is built.

- ``kvoffload.hf.OffloadedStaticCache``: the cache as a Hugging Face transformers ``Cache``
  (imported on demand, so that ``import kvoffload`` does not import transformers).
- ``parse_size`` / ``format_bytes``: the byte sizes the library reads and prints ("24GiB").
- ``cuda_device_count``: the CUDA devices the native library can use (0 when built without CUDA,
  or without a driver).
- ``library_path``: the libkvoffload.so.0 the package drives (through its C ABI, with ctypes: the
  library links no torch and no Python, so one build serves every torch and every Python).
"""

from ._capi import VERSION as __version__
from ._capi import library_path

__all__ = ["cuda_device_count", "format_bytes", "library_path", "parse_size", "__version__"]


def __getattr__(name):
    # The helpers live with the native cache, which imports torch: only when first asked for, so
    # that kvoffload._capi alone (the C ABI) imports without torch.
    if name in ("cuda_device_count", "format_bytes", "parse_size"):
        from . import _native
        return getattr(_native, name)
    raise AttributeError(f"module 'kvoffload' has no attribute {name!r}")
