"""Greedy generate with kvoffload.hf.OffloadedStaticCache gives exactly the tokens transformers'
own StaticCache gives: Llama (llama3 rope scaling), Mistral and Qwen2, one row and three
left-padded rows, with every layer streamed through the staging ring or kept resident, with sdpa
and eager attention, and again on the same cache after reset()."""

import unittest
import warnings

import torch
from transformers import StaticCache

from kvoffload.hf import OffloadedStaticCache
from tiny_models import MODEL_NAMES, make_model, prompts

MAX_CACHE_LEN = 40
NEW_TOKENS = 10


def reference(model, ids, mask):
    cache = StaticCache(config=model.config, max_cache_len=MAX_CACHE_LEN)
    return model.generate(
        ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False, cache=cache
    )


def with_offloaded(model, cache, ids, mask, keyword="cache"):
    return model.generate(
        ids,
        attention_mask=mask,
        max_new_tokens=NEW_TOKENS,
        do_sample=False,
        **{keyword: cache},
    )


class GreedyMatchesStaticCache(unittest.TestCase):
    def check_model(self, name, batch, pad_rows, resident_layers, attn_implementation="sdpa"):
        model = make_model(name, attn_implementation=attn_implementation)
        first = prompts(batch, 12, seed=1, pad_rows=pad_rows)
        second = prompts(batch, 7, seed=2, pad_rows=pad_rows[::-1])
        cache = OffloadedStaticCache(
            model.config,
            max_batch_size=batch,
            max_cache_len=MAX_CACHE_LEN,
            device="cpu",
            dtype=torch.float32,
            resident_layers=resident_layers,
        )
        case = f"{name}, batch {batch}, resident_layers={resident_layers}, {attn_implementation}"
        self.assertEqual(model.config._attn_implementation, attn_implementation)
        self.assertEqual(cache.plan()["resident_layers"], resident_layers, case)

        expected = reference(model, *first)
        # transformers 5.x renames past_key_values (deprecated) to cache: both must reach us.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            got = with_offloaded(model, cache, *first, keyword="past_key_values")
        self.assertEqual(got.tolist(), expected.tolist(), case)
        self.assertEqual(cache.get_seq_length(), 12 + NEW_TOKENS - 1, case)

        # The same cache again, after reset(), on other prompts of another length.
        cache.reset()
        self.assertEqual(cache.get_seq_length(), 0, case)
        expected = reference(model, *second)
        got = with_offloaded(model, cache, *second)
        self.assertEqual(got.tolist(), expected.tolist(), case + ", after reset()")

    def test_one_row(self):
        for name in MODEL_NAMES:
            self.check_model(name, batch=1, pad_rows=(), resident_layers=0)

    def test_three_left_padded_rows_streamed(self):
        for name in MODEL_NAMES:
            self.check_model(name, batch=3, pad_rows=(0, 3, 5), resident_layers=0)

    def test_three_left_padded_rows_partly_resident(self):
        # Layer 0 resident, layers 1..3 streamed through a ring of 2 buffers.
        self.check_model("llama3", batch=3, pad_rows=(4, 0, 1), resident_layers=1)

    def test_eager_attention(self):
        # transformers' eager attention (matmul + softmax) on the strided views, too.
        for name in MODEL_NAMES:
            self.check_model(name, batch=3, pad_rows=(2, 0, 5), resident_layers=0,
                             attn_implementation="eager")

    def test_all_resident(self):
        self.check_model("qwen2", batch=3, pad_rows=(2, 2, 0), resident_layers=4)

    def test_generated_tokens_depend_on_the_cache(self):
        # A guard on the tests above: with these tiny models, dropping the cached rows changes
        # the greedy tokens, so equality above means the rows were right.
        model = make_model("llama3")
        ids, mask = prompts(1, 12, seed=1)
        expected = reference(model, ids, mask)
        cache = OffloadedStaticCache(
            model.config, 1, MAX_CACHE_LEN, device="cpu", dtype=torch.float32, resident_layers=0
        )
        original_update = cache._update

        def zeroing_update(key_states, value_states, layer_idx, args, kwargs):
            keys, values = original_update(key_states, value_states, layer_idx, args, kwargs)
            return keys * 0, values
        cache._update = zeroing_update
        broken = with_offloaded(model, cache, ids, mask)
        self.assertNotEqual(broken.tolist(), expected.tolist())

    def test_mask_sizes_match_the_returned_keys(self):
        # At every layer of every forward, get_mask_sizes gives one column per key update
        # returns, asked before the layer's update (as a model building masks per layer would)
        # and, but for the last layer, after it; get_seq_length counts the forward from its
        # layer 0 on. (After the last layer's update the forward is complete for the cache, and
        # the answer is the next forward's, which is what transformers asks for next.)
        model = make_model("qwen2")
        ids, mask = prompts(3, 9, seed=5, pad_rows=(1, 0, 4))
        cache = OffloadedStaticCache(model.config, 3, MAX_CACHE_LEN, device="cpu",
                                     dtype=torch.float32, resident_layers=0)
        original_update = cache._update
        checked = []

        def checking_update(key_states, value_states, layer_idx, args, kwargs):
            tokens = key_states.shape[2]
            before = cache.get_mask_sizes(tokens, layer_idx)
            keys, values = original_update(key_states, value_states, layer_idx, args, kwargs)
            self.assertEqual(before, (keys.shape[2], 0))
            if layer_idx < len(model.model.layers) - 1:
                self.assertEqual(cache.get_mask_sizes(tokens, layer_idx), (keys.shape[2], 0))
            self.assertEqual(cache.get_seq_length(), keys.shape[2])
            checked.append(layer_idx)
            return keys, values

        cache._update = checking_update
        with_offloaded(model, cache, ids, mask)
        self.assertEqual(len(checked), NEW_TOKENS * len(model.model.layers))

    def test_continues_a_cache_without_reset(self):
        # generate on a cache that holds a conversation so far: transformers feeds only the new
        # tokens; the result is the same as one generate over the whole sequence.
        model = make_model("mistral")
        ids, mask = prompts(1, 12, seed=3)
        cache = OffloadedStaticCache(model.config, 1, MAX_CACHE_LEN, device="cpu",
                                     dtype=torch.float32, resident_layers=0)
        first = with_offloaded(model, cache, ids, mask)
        follow_up = torch.cat([first, prompts(1, 4, seed=4)[0]], dim=1)
        whole = torch.ones_like(follow_up)  # no padding (a generated token may equal PAD)
        got = model.generate(
            follow_up, attention_mask=whole, max_new_tokens=NEW_TOKENS, do_sample=False, cache=cache
        )
        self.assertEqual(cache.get_seq_length(), follow_up.shape[1] + NEW_TOKENS - 1)
        expected = model.generate(
            follow_up,
            attention_mask=whole,
            max_new_tokens=NEW_TOKENS,
            do_sample=False,
            cache=StaticCache(config=model.config, max_cache_len=MAX_CACHE_LEN),
        )
        self.assertEqual(got.tolist(), expected.tolist())


if __name__ == "__main__":
    unittest.main()
