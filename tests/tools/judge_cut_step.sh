#!/usr/bin/env bash
# The judge (tools/device_judge.py) over a step the deadline cut: its partial log (a replay that
# printed no JSON line) makes the run INCOMPLETE, its figure SKIPPED, never FAIL. The same log
# from a step that failed on its own is a problem, and the run FAILs.
#   judge_cut_step.sh WORK_DIR
set -u
work=$1
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
bands=$root/bench/results/expected-small.md
fail() { echo "judge_cut_step: $*" >&2; exit 1; }
rm -rf "$work"
mkdir -p "$work/cut" "$work/failed"
for case in cut failed; do
  echo '{"commit": "test", "backend": "host", "small": true}' >"$work/$case/env.json"
  printf 'replay: building the store...\nstep 1 of 8\n' >"$work/$case/replay_4096.log"
done
printf 'env\tPASS\t0\thost backend\nreplay\tSKIPPED\t12\tthe deadline cut it at 12 s of its 40 s\n' \
  >"$work/cut/steps.tsv"
printf 'env\tPASS\t0\thost backend\nreplay\tFAIL\t12\texit status 1\n' >"$work/failed/steps.tsv"

python3 "$root/tools/device_judge.py" --work "$work/cut" --bands "$bands" --out "$work/cut/out" \
  >"$work/cut.txt"
rc=$?
[ $rc = 3 ] || { cat "$work/cut.txt"; fail "a cut step: exit $rc, not 3"; }
grep -q "# device-check: INCOMPLETE" "$work/cut.txt" || fail "a cut step is not INCOMPLETE"
grep -q "replay_4k_h2d_bytes\`) | SKIPPED" "$work/cut.txt" || fail "its figure is not SKIPPED"
grep -q "no JSON line" "$work/cut.txt" && fail "its partial log was judged"

python3 "$root/tools/device_judge.py" --work "$work/failed" --bands "$bands" \
  --out "$work/failed/out" >"$work/failed.txt"
rc=$?
[ $rc = 1 ] || { cat "$work/failed.txt"; fail "a failed step: exit $rc, not 1"; }
grep -q "replay_4096.log: no JSON line" "$work/failed.txt" || fail "a failed step's log unread"
echo "judge_cut_step: a cut step INCOMPLETE, a failed one FAIL"
