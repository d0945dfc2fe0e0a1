#!/usr/bin/env bash
# KVO_REQUIRE_CUDA=1 turns every "no GPU" skip into a failure. Run with the GoogleTest binaries
# (and Python test files, as "python:FILE") whose CUDA tests skip without a GPU: without the
# variable they must pass; on a machine without a GPU, with it they must fail and say why.
#   cuda_required_check.sh PYTHON BINARY... [python:FILE...]
set -uo pipefail
python=$1
shift
status=0
for item in "$@"; do
  if [[ $item == python:* ]]; then
    cmd=("$python" -m unittest discover -s "$(dirname "${item#python:}")" -p "$(basename "$item")")
  else
    cmd=("$item" --gtest_filter='*Cuda*')
  fi
  if ! plain=$(env -u KVO_REQUIRE_CUDA "${cmd[@]}" 2>&1); then
    echo "FAIL: without KVO_REQUIRE_CUDA, ${item} failed:"; echo "$plain"; status=1; continue
  fi
  if ! grep -qiE "skipped|skip" <<<"$plain"; then
    echo "ok: ${item} ran its CUDA tests (a GPU is present)"; continue
  fi
  if required=$(KVO_REQUIRE_CUDA=1 "${cmd[@]}" 2>&1); then
    echo "FAIL: KVO_REQUIRE_CUDA=1 without a GPU, ${item} still passed:"; echo "$required"
    status=1
  elif grep -q "KVO_REQUIRE_CUDA=1" <<<"$required"; then
    echo "ok: ${item} skips without a GPU, and fails with KVO_REQUIRE_CUDA=1"
  else
    echo "FAIL: ${item} failed with KVO_REQUIRE_CUDA=1 but did not name it:"; echo "$required"
    status=1
  fi
done
exit $status
