"""kvoffload: an offloaded static KV cache for long-context decoding.

The full-length K/V of every streamed layer lives in (pinned) host memory and is streamed layer by
layer through a small ring of device buffers; only each layer's valid prefix moves host->device
and only the rows a step appends move back. Every byte is allocated once, when the cache is built.

- ``kvoffload.hf.OffloadedStaticCache``: the cache as a Hugging Face transformers ``Cache``
  (imported on demand, so that ``import kvoffload`` does not import transformers).
- ``parse_size`` / ``format_bytes``: the byte sizes the library reads and prints ("24GiB").
- ``cuda_device_count``: the CUDA devices the native library can use (0 when built without CUDA).
"""

# torch first: the extension links libtorch and libtorch_python, which `import torch` loads.
import torch  # noqa: F401

from ._native import cuda_device_count, format_bytes, parse_size

__version__ = "0.1.0"

__all__ = ["cuda_device_count", "format_bytes", "parse_size", "__version__"]
