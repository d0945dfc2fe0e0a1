"""Sliding and chunked windows shorter than the cache: served from static window buffers on the
device with the tokens transformers' StaticCache gives, for Gemma 2 and 3, Cohere2, GPT-OSS,
Llama 4 text (chunked), and Mistral, Qwen2 and Starcoder2 with an 8-token window (all layers of
Mistral and Starcoder2 are windows: nothing is offloaded). Prompts of 12 and 5 tokens with 8 new
ones cross the window during the prefill and during decoding; a continued conversation adds
several tokens to a full window."""

import unittest

import torch

from greedy import (MAX_CACHE_LEN, NEW_TOKENS, check_architecture, greedy, offloaded,
                    reference_cache, zero_returned_keys)
from kvoffload.hf_local import WindowLayer
from tiny_models import WINDOW, make_model, prompts


class GreedyMatchesStaticCache(unittest.TestCase):
    def test_gemma2(self):
        check_architecture(self, "gemma2")

    def test_gemma3(self):
        check_architecture(self, "gemma3")

    def test_cohere2(self):
        check_architecture(self, "cohere2")

    def test_gpt_oss(self):
        check_architecture(self, "gpt_oss")

    def test_llama4_chunked(self):
        check_architecture(self, "llama4")

    def test_mistral_window(self):
        check_architecture(self, "mistral_window")

    def test_qwen2_window_from_layer_2(self):
        check_architecture(self, "qwen2_window")

    def test_starcoder2(self):
        check_architecture(self, "starcoder2")


class Windows(unittest.TestCase):
    def test_continued_conversation_adds_several_tokens_to_a_full_window(self):
        model = make_model("gemma3", attn_implementation="eager")
        ids, mask = prompts(1, 12, seed=3)
        cache = offloaded(model, 1)
        first = greedy(model, cache, ids, mask)
        follow_up = torch.cat([first, prompts(1, 4, seed=4)[0]], dim=1)
        whole = torch.ones_like(follow_up)
        got = greedy(model, cache, follow_up, whole)
        expected = greedy(model, reference_cache(model), follow_up, whole)
        self.assertEqual(got.tolist(), expected.tolist())

    def test_window_rows_are_what_the_model_attends_to(self):
        # A guard on the tests above: zeroing the window keys changes the tokens.
        model = make_model("mistral_window")
        ids, mask = prompts(1, 12, seed=1)
        expected = greedy(model, reference_cache(model), ids, mask)
        cache = offloaded(model, 1, resident_layers=None)
        zero_returned_keys(cache)
        self.assertNotEqual(greedy(model, cache, ids, mask).tolist(), expected.tolist())

    def test_a_window_keeps_the_last_tokens_in_order(self):
        # After 12 + 7 tokens, each window layer holds the keys and values of tokens 11..18 in
        # order: exactly the last WINDOW rows the model gave it in this run (no tolerance).
        model = make_model("gemma2", attn_implementation="eager")
        ids, mask = prompts(1, 12, seed=1)
        cache = offloaded(model, 1)
        given = {}  # layer -> ([key states], [value states]) in the order update() got them
        update = cache.update

        def recording_update(key_states, value_states, layer_idx, *args, **kwargs):
            keys, values = given.setdefault(layer_idx, ([], []))
            keys.append(key_states.clone())
            values.append(value_states.clone())
            return update(key_states, value_states, layer_idx, *args, **kwargs)

        cache.update = recording_update
        greedy(model, cache, ids, mask)
        windows = [i for i, layer in enumerate(cache.layers) if isinstance(layer, WindowLayer)]
        self.assertEqual(windows, [0, 2])
        for index in windows:
            ours = cache.layers[index]
            self.assertEqual(ours.get_seq_length(), 12 + NEW_TOKENS - 1)
            self.assertEqual(ours.keys.shape[2], WINDOW)
            all_keys = torch.cat(given[index][0], dim=2)
            all_values = torch.cat(given[index][1], dim=2)
            self.assertEqual(all_keys.shape[2], 12 + NEW_TOKENS - 1)
            self.assertTrue(torch.equal(ours.keys, all_keys[:, :, -WINDOW:]), index)
            self.assertTrue(torch.equal(ours.values, all_values[:, :, -WINDOW:]), index)

if __name__ == "__main__":
    unittest.main()
