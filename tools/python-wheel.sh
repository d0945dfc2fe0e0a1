#!/usr/bin/env bash
# Builds the Python package's wheel the way a user's `pip install .` does (pyproject.toml:
# scikit-build-core drives this CMake project, the library and the package only) and installs it
# into a virtual environment beside a Python that has torch and transformers, so that tests run
# against the installed package and not the build tree.
#   tools/python-wheel.sh [--wheel FILE] PYTHON WORKDIR
# PYTHON: a Python with torch and transformers (the project's: tools/python-env.sh).
# --wheel: install FILE, a wheel built before, instead of building one (the same wheel beside
# another torch).
# WORKDIR/wheel: the wheel; WORKDIR/build: its CMake build, kept, so a second run is incremental;
# WORKDIR/venv: the environment (its site-packages reads PYTHON's after its own).
# Prints the wheel's name, size and files, the installed library's NEEDED entries and how long
# each part took; fails when the library needs libtorch, libc10 or libpython, or when the
# environment imports kvoffload from anywhere but its own site-packages.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
wheel=""
if [ "${1:-}" = --wheel ]; then
  wheel=$(realpath "$2")
  shift 2
fi
python=$1
work=$2
mkdir -p "$work"

if [ -z "$wheel" ]; then
  rm -rf "$work/wheel"
  start=$SECONDS
  "$python" -m pip wheel --quiet --disable-pip-version-check --no-deps \
    --wheel-dir "$work/wheel" -C build-dir="$work/build" "$root"
  wheel=$(ls "$work"/wheel/kvoffload-*.whl)
  echo "== pip wheel: $((SECONDS - start)) s: $(basename "$wheel"), $(stat -c %s "$wheel") bytes"
fi
"$python" -m zipfile -l "$wheel"

start=$SECONDS
if [ ! -x "$work/venv/bin/python" ]; then
  "$python" -m venv --without-pip "$work/venv"
  # PYTHON's packages (torch, transformers) after the environment's own.
  theirs=$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  mine=$("$work/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "$theirs" > "$mine/beside.pth"
fi
"$python" -m pip --python "$work/venv/bin/python" install --quiet --disable-pip-version-check \
  --no-deps --force-reinstall "$wheel"
echo "== installed into $work/venv: $((SECONDS - start)) s"

library=$("$work/venv/bin/python" -c '
import os, sys, sysconfig, kvoffload
site = os.path.realpath(sysconfig.get_paths()["purelib"])
for path in (kvoffload.__file__, kvoffload.library_path()):
    if not os.path.realpath(path).startswith(site + os.sep):
        sys.exit(f"kvoffload came from {path}, not from the environment ({site})")
print(kvoffload.library_path())')
needed=$(readelf -d "$library" | grep NEEDED || true)
echo "== $library needs:"
echo "$needed"
if grep -Eiq 'libtorch|libc10|libpython' <<<"$needed"; then
  echo "FAILED: the package's library links torch or Python" >&2
  exit 1
fi
"$work/venv/bin/python" -c '
import kvoffload, torch
print("kvoffload", kvoffload.__version__, "beside torch", torch.__version__, "CUDA devices:",
      kvoffload.cuda_device_count())'
echo "== the wheel is installed and links no torch, no c10, no Python"
