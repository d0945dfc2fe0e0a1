#!/usr/bin/env bash
# One wheel, several torch versions: builds the package's wheel once (tools/python-wheel.sh), then
# for each torch version given makes (once per machine, in ~/.cache/kvoffload/torch-VERSION) a
# Python environment with that torch and the project's transformers, installs the same wheel
# beside it and runs the drop-in's test files against it. Prints one line per version and file;
# exits non-zero when any failed. Too slow for CI (each torch is gigabytes from PyPI); run it when
# the package's torch floor (pyproject.toml) or the custom op changes, and record the result in
# bench/results/.
#   bench/wheel_torch_versions.sh 2.9 2.14 [...]
# Environment: KVO_WHEEL_TESTS (default "test_hf_generate test_hf_compile test_hf_kv_dtype
# test_hf_errors test_hf_windows").
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tests=${KVO_WHEEL_TESTS:-test_hf_generate test_hf_compile test_hf_kv_dtype test_hf_errors test_hf_windows}
cache=${XDG_CACHE_HOME:-$HOME/.cache}/kvoffload
transformers=$(grep '^transformers==' "$root/tools/python-requirements.txt")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

project=$("$root/tools/python-env.sh")/bin/python
bash "$root/tools/python-wheel.sh" "$project" "$work/project" | grep '^== pip wheel'
wheel=$(ls "$work"/project/wheel/kvoffload-*.whl)
echo "== commit $(git -C "$root" rev-parse --short HEAD), $(basename "$wheel")"
status=0
for version in "$@"; do
  env_dir=$cache/torch-$version
  if [ ! -f "$env_dir/.complete" ]; then
    rm -rf "$env_dir"
    python3 -m venv "$env_dir"
    "$env_dir/bin/pip" install --quiet --disable-pip-version-check "torch==$version.*" \
      "$transformers" numpy
    touch "$env_dir/.complete"
  fi
  bash "$root/tools/python-wheel.sh" --wheel "$wheel" "$env_dir/bin/python" "$work/$version" |
    grep '^kvoffload '
  for t in $tests; do
    start=$SECONDS
    if (cd "$root/tests/python" && PYTHONPATH=$PWD KVO_EXPECT_INSTALLED_PACKAGE=1 \
          PYTHONDONTWRITEBYTECODE=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
          TRANSFORMERS_VERBOSITY=error OMP_NUM_THREADS=1 \
          "$work/$version/venv/bin/python" -m unittest discover -s . -p "$t.py" \
          >"$work/$version-$t.log" 2>&1); then
      verdict=passed
    else
      verdict=FAILED
      status=1
      tail -n 20 "$work/$version-$t.log"
    fi
    echo "torch $version: $t $verdict ($(grep -m1 '^Ran' "$work/$version-$t.log" || echo 'no tests ran'), $((SECONDS - start)) s)"
  done
done
exit $status
