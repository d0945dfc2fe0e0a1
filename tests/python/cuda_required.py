"""needs_cuda: skips a test (or a TestCase class) without a GPU, unless KVO_REQUIRE_CUDA=1 says a
GPU must be there (tools/device-check.sh sets it): then a missing GPU fails the test, so a broken
device setup never passes as a run of skipped tests."""

import functools
import os
import unittest

import torch

import kvoffload

REASON = "needs a CUDA device and a CUDA build of kvoffload"


def _fail(*_args, **_kwargs):
    raise AssertionError("KVO_REQUIRE_CUDA=1, but " + REASON.replace("needs", "there is no"))


def needs_cuda(obj):
    if torch.cuda.is_available() and kvoffload.cuda_device_count() > 0:
        return obj
    if os.environ.get("KVO_REQUIRE_CUDA") != "1":
        return unittest.skip(REASON)(obj)
    if isinstance(obj, type):
        obj.setUpClass = classmethod(_fail)
        return obj
    return functools.wraps(obj)(_fail)
