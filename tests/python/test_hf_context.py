"""Saved contexts in the Python drop-in: a cache saved after the prompt and loaded into a new cache
(OffloadedStaticCache.load) continues a greedy generate with exactly the tokens of a cache that
never stopped; a file for another model config or dtype, or a corrupted one, is refused with the
difference or the failing block named."""

import os
import tempfile
import unittest

import torch

from kvoffload.hf import OffloadedStaticCache
from tiny_models import make_model, prompts

MAX_CACHE_LEN = 48


class SavedContext(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.dir.name, "context.kvo")

    def tearDown(self):
        self.dir.cleanup()

    def test_load_continues_like_one_generate(self):
        model = make_model("llama3")
        document, _ = prompts(1, 20, seed=3)
        question, _ = prompts(1, 6, seed=4)
        whole = torch.cat([document, question], dim=1)

        once = OffloadedStaticCache(model.config, 1, MAX_CACHE_LEN, dtype=model.dtype,
                                    resident_layers=1)
        expected = model.generate(whole, max_new_tokens=8, do_sample=False, cache=once)

        saved = OffloadedStaticCache(model.config, 1, MAX_CACHE_LEN, dtype=model.dtype,
                                     resident_layers=0)
        with torch.no_grad():
            model(document, cache=saved, use_cache=True)
        saved.save(self.path, tokens=document[0].tolist())

        loaded = OffloadedStaticCache.load(self.path, model.config, resident_layers=2)
        self.assertEqual(loaded.get_seq_length(), document.shape[1])
        self.assertEqual(loaded.saved_tokens, [document[0].tolist()])
        got = model.generate(whole, max_new_tokens=8, do_sample=False, cache=loaded)
        self.assertEqual(got.tolist(), expected.tolist())

    def test_refusals(self):
        model = make_model("llama3")
        document, _ = prompts(1, 10, seed=5)
        cache = OffloadedStaticCache(model.config, 1, MAX_CACHE_LEN, dtype=model.dtype)
        with torch.no_grad():
            model(document, cache=cache, use_cache=True)
        cache.save(self.path)

        other = make_model("qwen2")
        with self.assertRaisesRegex(ValueError, "saved from a cache with|saved for another model"):
            OffloadedStaticCache.load(self.path, other.config)
        with self.assertRaisesRegex(ValueError, "K/V dtype f32, this one has K/V dtype bf16"):
            OffloadedStaticCache.load(self.path, model.config, dtype=torch.bfloat16)

        with open(self.path, "rb") as f:
            data = bytearray(f.read())
        data[len(data) - 20] ^= 0x40  # in the last layer's V rows
        with open(self.path, "wb") as f:
            f.write(data)
        layers = model.config.num_hidden_layers
        with self.assertRaisesRegex(ValueError, f"the block of layer {layers - 1} of {layers} is "
                                                "corrupted"):
            OffloadedStaticCache.load(self.path, model.config)


if __name__ == "__main__":
    unittest.main()
