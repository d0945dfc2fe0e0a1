#!/usr/bin/env bash
# tools/device-check.sh killed halfway, as a device call's limit kills it: SIGKILL to the whole
# process group once its second step with figures (decode) has finished, so no trap and no final
# judge run. Everything that had finished must be in --out: steps.tsv, and a summary and JSON
# judged INCOMPLETE holding the finished steps' figures.
#   device_check_killed.sh BUILD_DIR OUT_DIR
set -u
build=$1
out=$2
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
rm -rf "$out" "$out.tmp"
mkdir -p "$out" "$out.tmp"
export TMPDIR=$out.tmp  # the killed run's work folder, which its trap never removes
setsid bash "$root/tools/device-check.sh" --build "$build" --small --backend host --out "$out" \
  >"$out.log" 2>&1 &
pid=$!
# Wait for the condition, not for a time: decode's line in the published steps (the step after
# bandwidth), or the run's end, whichever comes first; 240 s at most.
for _ in $(seq 2400); do
  grep -q "^decode	" "$out/steps.tsv" 2>/dev/null && break
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.1
done
kill -KILL -- "-$pid" 2>/dev/null
wait "$pid" 2>/dev/null
fail() { echo "device_check_killed: $*" >&2; cat "$out.log" >&2; exit 1; }
grep -q "^decode	PASS" "$out/steps.tsv" 2>/dev/null || fail "no finished decode step in steps.tsv"
grep -q "^generate	" "$out/steps.tsv" && fail "the run was not killed halfway: generate ran"
[ -f "$out/summary.md" ] || fail "no summary.md"
head -n 1 "$out/summary.md" | grep -q "# device-check: INCOMPLETE" ||
  fail "summary.md says $(head -n 1 "$out/summary.md"), not INCOMPLETE"
grep -q "| bandwidth | PASS |" "$out/summary.md" || fail "bandwidth's step is not in summary.md"
grep -Eq "decode_streamed_4k_ms\`\) \| PASS \| [0-9.]+" "$out/summary.md" ||
  fail "decode's figure is not in summary.md"
python3 - "$out/device-check.json" <<'PY' || fail "device-check.json lacks the finished figures"
import json, sys
doc = json.load(open(sys.argv[1]))
got = {f["key"]: f["measured"] for f in doc["figures"]}
assert doc["verdict"] == "INCOMPLETE", doc["verdict"]
assert got["h2d_GBps"] and got["decode_streamed_4k_ms"], got
assert got.get("replay_4k_h2d_bytes") is None  # replay never finished
PY
[ -f "$out/logs.tar.gz" ] && tar -tzf "$out/logs.tar.gz" | grep -q "logs/decode.log" ||
  fail "logs.tar.gz lacks decode's log"
ls "$out"/*.part >/dev/null 2>&1 && echo "note: a file was being replaced when the kill came"
rm -rf "$out.tmp"
echo "device_check_killed: INCOMPLETE with bandwidth's and decode's figures, as killed"
