"""Fixed-size states (linear attention, convolutions, Mamba) held in static device buffers
allocated at construction, with the tokens transformers' own cache gives: Qwen3-Next (gated delta
net), Jamba (Mamba), Bamba and Falcon-H1 (Mamba-2; Falcon-H1's layers are hybrid, a state and
full attention in one layer), LFM2 (short convolution) and MiniMax (lightning attention, through
its own cache class's interface)."""

import unittest

import torch

from greedy import check_architecture, greedy, offloaded, reference_cache
from kvoffload.hf_local import StateLayer
from tiny_models import make_model, prompts


class GreedyMatchesTransformers(unittest.TestCase):
    def test_qwen3_next(self):
        check_architecture(self, "qwen3_next")

    def test_jamba(self):
        check_architecture(self, "jamba")

    def test_bamba(self):
        check_architecture(self, "bamba")

    def test_falcon_h1_hybrid_layers(self):
        check_architecture(self, "falcon_h1")

    def test_lfm2(self):
        check_architecture(self, "lfm2")

    def test_minimax(self):
        check_architecture(self, "minimax")
        # Its forward masks the valid rows only: static shapes are off by default for it, and
        # asking for them is refused rather than attending over unmasked rows.
        model = make_model("minimax")
        self.assertFalse(offloaded(model, 1).static_shapes)
        with self.assertRaisesRegex(ValueError, "static_shapes=True is not supported"):
            offloaded(model, 1, static_shapes=True)


class States(unittest.TestCase):
    def test_states_are_what_the_model_reads(self):
        # A guard on the tests above: zeroing a recurrent state after each step changes the
        # tokens, so equality above means the states were kept.
        model = make_model("qwen3_next")
        ids, mask = prompts(1, 12, seed=1)
        expected = greedy(model, reference_cache(model), ids, mask)
        cache = offloaded(model, 1)
        original = cache.update_recurrent_state

        def forgetting(recurrent_states, layer_idx, state_idx=0, **kwargs):
            return original(recurrent_states * 0, layer_idx, state_idx, **kwargs)

        cache.update_recurrent_state = forgetting
        self.assertNotEqual(greedy(model, cache, ids, mask).tolist(), expected.tolist())

    def test_reset_zeroes_the_states(self):
        model = make_model("jamba")
        cache = offloaded(model, 1)
        greedy(model, cache, *prompts(1, 6, seed=2))
        states = [b for layer in cache.layers if isinstance(layer, StateLayer)
                  for b in layer.buffers()]
        self.assertTrue(any(bool(b.any()) for b in states))
        cache.reset()
        self.assertFalse(any(bool(b.any()) for b in states))
        self.assertIsNone(cache.get_conv_state(0))
        self.assertFalse(cache.has_previous_state(0))

    def test_crop_is_refused(self):
        model = make_model("lfm2")
        cache = offloaded(model, 1)
        greedy(model, cache, *prompts(1, 6, seed=2))
        with self.assertRaises(ValueError) as raised:
            cache.crop(-1)
        self.assertIn("cannot be rolled back", str(raised.exception))
        self.assertEqual(cache.get_seq_length(), 6 + 8 - 1)


if __name__ == "__main__":
    unittest.main()
