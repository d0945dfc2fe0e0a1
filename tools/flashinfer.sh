#!/usr/bin/env bash
# Prints the path of FlashInfer's header-only CUDA templates (the `include` folder of the
# flashinfer-python wheel), fetching the pinned wheel from PyPI once per machine into
# ~/.cache/kvoffload. The CUDA attention kernels (model/cuda/flashinfer_*.cu) are instantiated from
# these headers at build time; nothing is compiled at run time. KVO_FLASHINFER_DIR overrides the
# location.
#
# 0.6.0 is pinned: its headers compile with CUDA 13.0 (0.7.x needs a newer CCCL than 13.0 ships).
set -euo pipefail
version=0.6.0
sha256=e8be4fd2f9229a7faef411579439eebc6c6dc54893d62bd50498f374cd04cc16
cache=${XDG_CACHE_HOME:-$HOME/.cache}/kvoffload
dir=${KVO_FLASHINFER_DIR:-$cache/flashinfer-$version}
if [ ! -f "$dir/.complete" ]; then
  echo "kvoffload: fetching FlashInfer $version headers into $dir (once)" >&2
  if ! python3 -m pip --version >/dev/null 2>&1; then
    sudo_cmd=""
    [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
    $sudo_cmd apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends \
      python3-pip >/dev/null
  fi
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  python3 -m pip download --quiet --disable-pip-version-check --no-deps \
    "flashinfer-python==$version" -d "$work" >&2
  wheel="$work/flashinfer_python-$version-py3-none-any.whl"
  echo "$sha256  $wheel" | sha256sum --check --quiet
  rm -rf "$dir"
  mkdir -p "$dir"
  # Only the headers: the wheel's Python code, CUTLASS copy and sources are not needed.
  python3 - "$wheel" "$dir" <<'PY'
import sys, zipfile
wheel, out = sys.argv[1], sys.argv[2]
prefix = "flashinfer/data/include/"
with zipfile.ZipFile(wheel) as z:
    members = [m for m in z.namelist() if m.startswith(prefix) and not m.endswith("/")]
    for m in members:
        info = z.getinfo(m)
        info.filename = "include/" + m[len(prefix):]
        z.extract(info, out)
print(f"{len(members)} headers", file=sys.stderr)
PY
  touch "$dir/.complete"
fi
echo "$dir/include"
