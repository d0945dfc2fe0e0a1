"""Greedy generate with kvoffload.hf.OffloadedStaticCache gives exactly the tokens transformers'
own StaticCache gives on models whose every layer is full attention: Llama (llama3 rope scaling),
Mistral (its 4096-token window never hides a token here), Qwen2, Falcon's and GPT-BigCode's
multi-query layouts (one KV head while Falcon's num_kv_heads says 4) and Falcon-40B's new decoder
architecture (its 2 KV groups cached broadcast to all 4 heads), and DeepSeek V2 and V3's
multi-head latent attention (keys and values of different head sizes). Each one: one row streamed, two left-padded
rows partly resident, again after reset(), sdpa and eager (greedy.check_architecture). Then what
the cache answers transformers along the way: mask sizes, lengths, a continued conversation."""

import unittest
import warnings

import torch
from transformers import StaticCache

from greedy import (MAX_CACHE_LEN, NEW_TOKENS, check_architecture, greedy, offloaded,
                    zero_returned_keys)
from tiny_models import make_model, prompts


class GreedyMatchesStaticCache(unittest.TestCase):
    def test_llama3(self):
        check_architecture(self, "llama3")

    def test_mistral(self):
        check_architecture(self, "mistral")

    def test_qwen2(self):
        check_architecture(self, "qwen2")

    def test_falcon_multi_query(self):
        check_architecture(self, "falcon")

    def test_falcon_new_decoder_architecture(self):
        check_architecture(self, "falcon_40b")

    def test_gpt_bigcode_multi_query(self):
        check_architecture(self, "gpt_bigcode")

    def test_deepseek_v2_latent_keys_and_rope_values(self):
        # Multi-head latent attention: one head, 32-wide keys and 8-wide values.
        check_architecture(self, "deepseek_v2")

    def test_deepseek_v3_latent_keys_and_rope_values(self):
        check_architecture(self, "deepseek_v3")

    def test_all_resident_and_the_deprecated_keyword(self):
        # transformers 5.x renames past_key_values (deprecated) to cache: both reach the cache.
        model = make_model("qwen2")
        ids, mask = prompts(3, 9, seed=4, pad_rows=(2, 2, 0))
        cache = offloaded(model, 3, resident_layers=4)
        self.assertEqual(cache.plan()["streamed_layers"], 0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            got = model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS,
                                 do_sample=False, past_key_values=cache)
        expected = greedy(model, StaticCache(config=model.config, max_cache_len=MAX_CACHE_LEN),
                          ids, mask)
        self.assertEqual(got.tolist(), expected.tolist())

    def test_assisted_decoding_and_prompt_lookup_match_greedy(self):
        # Both propose tokens the model checks in one forward and crop the rejected ones from the
        # cache: a draft model of the same vocabulary (assisted decoding) and n-grams of the prompt
        # (prompt lookup). Every layer streamed and every layer resident: the tokens are greedy's
        # over StaticCache, and rows were cropped along the way.
        model = make_model("llama3")
        draft = make_model("llama3", seed=1)
        ids, mask = prompts(1, 12, seed=7)
        new_tokens = 16
        expected = greedy(model, StaticCache(config=model.config, max_cache_len=MAX_CACHE_LEN),
                          ids, mask, new_tokens=new_tokens)
        for resident in (0, model.config.num_hidden_layers):
            for mode in ({"assistant_model": draft}, {"prompt_lookup_num_tokens": 3}):
                cache = offloaded(model, 1, resident_layers=resident)
                cropped = []
                crop = cache.crop
                cache.crop = lambda n, crop=crop, cropped=cropped: (cropped.append(-n), crop(n))
                got = greedy(model, cache, ids, mask, new_tokens=new_tokens, **mode)
                what = f"{list(mode)[0]}, resident_layers={resident}"
                self.assertEqual(got.tolist(), expected.tolist(), what)
                if "assistant_model" in mode:  # a random draft: most of its tokens are rejected
                    self.assertGreater(sum(cropped), 0, what)

    def test_beam_search_matches_static_cache(self):
        # Two beams in two slots: at every step transformers reorders the cache to the surviving
        # beams (reorder_cache), the full-attention rows in the native cache, resident or
        # streamed, and a model's window rows here (mistral_window: windows shorter than the
        # prompt). The tokens are StaticCache's, and the reorders moved rows.
        for name in ("llama3", "mistral_window"):
            model = make_model(name)
            ids, mask = prompts(1, 12, seed=8)
            kwargs = dict(num_beams=2, num_return_sequences=2, do_sample=False,
                          max_new_tokens=NEW_TOKENS)
            expected = model.generate(ids, attention_mask=mask, cache=StaticCache(
                config=model.config, max_cache_len=MAX_CACHE_LEN), **kwargs)
            offloaded_layers = offloaded(model, 2).plan()["offloaded_layers"]
            for resident in sorted({0, offloaded_layers}):
                cache = offloaded(model, 2, resident_layers=resident)
                got = model.generate(ids, attention_mask=mask, cache=cache, **kwargs)
                what = f"{name}, resident_layers={resident}"
                self.assertEqual(got.tolist(), expected.tolist(), what)
                if offloaded_layers > 0:
                    self.assertGreater(cache.stats()["reorder_bytes"], 0, what)

    def test_generated_tokens_depend_on_the_cache(self):
        # A guard on the tests above: with these tiny models, dropping the cached rows changes
        # the greedy tokens, so equality above means the rows were right.
        model = make_model("llama3")
        ids, mask = prompts(1, 12, seed=1)
        expected = greedy(model, StaticCache(config=model.config, max_cache_len=MAX_CACHE_LEN),
                          ids, mask)
        cache = offloaded(model, 1)
        zero_returned_keys(cache)
        self.assertNotEqual(greedy(model, cache, ids, mask).tolist(), expected.tolist())

    def test_mask_sizes_match_the_returned_keys(self):
        # At every layer of every forward, get_mask_sizes gives one column per key update
        # returns, asked before the layer's update (as a model building masks per layer would)
        # and, but for the last layer, after it; get_seq_length counts the forward from its
        # layer 0 on. (After the last layer's update the forward is complete for the cache, and
        # the answer is the next forward's, which is what transformers asks for next.)
        model = make_model("qwen2")
        ids, mask = prompts(3, 9, seed=5, pad_rows=(1, 0, 4))
        cache = offloaded(model, 3, static_shapes=False)  # the valid rows only
        original_update = cache.update
        checked = []

        def checking_update(key_states, value_states, layer_idx, *args, **kwargs):
            tokens = key_states.shape[2]
            before = cache.get_mask_sizes(tokens, layer_idx)
            keys, values = original_update(key_states, value_states, layer_idx, *args, **kwargs)
            self.assertEqual(before, (keys.shape[2], 0))
            if layer_idx < len(model.model.layers) - 1:
                self.assertEqual(cache.get_mask_sizes(tokens, layer_idx), (keys.shape[2], 0))
            self.assertEqual(cache.get_seq_length(), keys.shape[2])
            checked.append(layer_idx)
            return keys, values

        cache.update = checking_update
        greedy(model, cache, ids, mask)
        self.assertEqual(len(checked), NEW_TOKENS * len(model.model.layers))

    def test_a_checkpoint_that_names_a_cache_implementation(self):
        # A generation_config with cache_implementation set makes generate refuse a cache object
        # ("Passing both ... is unsupported"); cache_implementation=None in the call, as the
        # Python docs (docs/python.md) say next to its example, lets ours through.
        model = make_model("llama3")
        model.generation_config.cache_implementation = "static"
        ids, mask = prompts(1, 6, seed=6)
        with self.assertRaises(ValueError) as raised:
            greedy(model, offloaded(model, 1), ids, mask)
        self.assertIn("Passing both", str(raised.exception))
        cache = offloaded(model, 1)
        got = greedy(model, cache, ids, mask, cache_implementation=None)
        expected = greedy(model, StaticCache(config=model.config, max_cache_len=MAX_CACHE_LEN),
                          ids, mask, cache_implementation=None)
        self.assertEqual(got.tolist(), expected.tolist())
        self.assertEqual(cache.get_seq_length(), 6 + NEW_TOKENS - 1)

    def test_continues_a_cache_without_reset(self):
        # generate on a cache that holds a conversation so far: transformers feeds only the new
        # tokens; the result is the same as one generate over the whole sequence.
        model = make_model("mistral")
        ids, mask = prompts(1, 12, seed=3)
        cache = offloaded(model, 1)
        first = greedy(model, cache, ids, mask)
        follow_up = torch.cat([first, prompts(1, 4, seed=4)[0]], dim=1)
        whole = torch.ones_like(follow_up)  # no padding (a generated token may equal PAD)
        got = greedy(model, cache, follow_up, whole)
        self.assertEqual(cache.get_seq_length(), follow_up.shape[1] + NEW_TOKENS - 1)
        expected = greedy(model, StaticCache(config=model.config, max_cache_len=MAX_CACHE_LEN),
                          follow_up, whole)
        self.assertEqual(got.tolist(), expected.tolist())


if __name__ == "__main__":
    unittest.main()
