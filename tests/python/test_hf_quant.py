"""Weight-quantized models with the cache: optimum-quanto int8 weights and torchao int8
weight-only, the two weight-quantization backends of transformers that run on the CPU. The keys
and values stay float whatever the weights are, so greedy tokens equal StaticCache's on the same
quantized model (two left-padded rows, one layer resident and three streamed)."""

import tempfile
import unittest

import torch
from transformers import AutoModelForCausalLM, QuantoConfig, StaticCache, TorchAoConfig

from greedy import MAX_CACHE_LEN, greedy, offloaded
from tiny_models import make_model, prompts


class QuantizedWeights(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.directory = tempfile.TemporaryDirectory()
        cls.float_model = make_model("llama3")
        cls.float_model.save_pretrained(cls.directory.name)
        cls.ids, cls.mask = prompts(2, 12, seed=1, pad_rows=(3, 0))

    @classmethod
    def tearDownClass(cls):
        cls.directory.cleanup()

    def check(self, quantization_config, weight_class):
        model = AutoModelForCausalLM.from_pretrained(
            self.directory.name, quantization_config=quantization_config, dtype=torch.float32
        ).eval()
        weight = model.model.layers[0].self_attn.q_proj.weight
        self.assertEqual(type(weight).__name__, weight_class)  # the weights are quantized ...
        with torch.no_grad():  # ... and it shows in the logits
            quantized_logits = model(self.ids, attention_mask=self.mask).logits
            float_logits = self.float_model(self.ids, attention_mask=self.mask).logits
        self.assertFalse(torch.equal(quantized_logits, float_logits))

        expected = greedy(model, StaticCache(config=model.config, max_cache_len=MAX_CACHE_LEN),
                          self.ids, self.mask)
        cache = offloaded(model, 2, resident_layers=1)
        self.assertEqual(greedy(model, cache, self.ids, self.mask).tolist(), expected.tolist())

    def test_optimum_quanto_int8(self):
        self.check(QuantoConfig(weights="int8"), "WeightQBytesTensor")

    def test_torchao_int8_weight_only(self):
        from torchao.quantization import Int8WeightOnlyConfig

        self.check(TorchAoConfig(Int8WeightOnlyConfig()), "Int8Tensor")


if __name__ == "__main__":
    unittest.main()
