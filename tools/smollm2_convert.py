"""Dequantizes a GGUF checkpoint with transformers and saves it as a Hugging Face model directory
(float32 safetensors, tokenizer.json and its config) that kvo-generate and transformers both load.

    python smollm2_convert.py MODEL.gguf OUT_DIR
"""
import os
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def main():
    gguf, out = sys.argv[1], sys.argv[2]
    folder, name = os.path.split(gguf)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    # Saved as plain float32 weights: the GGUF's quantization is gone once dequantized.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


if __name__ == "__main__":
    main()
