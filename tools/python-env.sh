#!/usr/bin/env bash
# Creates (once) and prints the path of the Python environment that the reference checks and the
# LibTorch build use: torch (whose wheel carries LibTorch), transformers and safetensors from
# PyPI. It lives outside the checkout, keyed by the pinned versions, so every clone on a machine
# shares one install; KVO_PYTHON_ENV overrides the location.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
requirements="$here/python-requirements.txt"
key=$(sha256sum "$requirements" | cut -c1-12)
env_dir=${KVO_PYTHON_ENV:-${XDG_CACHE_HOME:-$HOME/.cache}/kvoffload/python-$key}
if [ ! -x "$env_dir/bin/python" ] || [ ! -f "$env_dir/.complete" ]; then
  echo "kvoffload: installing the Python reference environment into $env_dir (once)" >&2
  rm -rf "$env_dir"
  python3 -m venv "$env_dir"
  "$env_dir/bin/pip" install --quiet --disable-pip-version-check -r "$requirements" >&2
  touch "$env_dir/.complete"
fi
echo "$env_dir"
