#!/usr/bin/env python3
"""Flags, in every shell script that sets pipefail, a pipe into a reader that may stop before its
writer is done (head, grep -q/-m/-l, awk's or sed's early exit). The writer then dies of SIGPIPE
and pipefail turns that into the pipeline's status 141, only once the writer's output outgrows the
pipe's buffer: green on one machine, red on another with a longer listing.

    tools/check_scripts.py [ROOT]
"""
import pathlib
import re
import sys

EARLY_READERS = [
    (re.compile(r"\|\s*head\b"), "head"),
    (re.compile(r"\|\s*grep\s+(-\w*[qml]\w*|--quiet|--silent|--max-count|--files-with-matches)\b"),
     "grep that stops at its first match"),
    (re.compile(r"\|\s*awk\b[^|]*\bexit\b"), "awk that exits early"),
    (re.compile(r"\|\s*sed\b[^|]*[0-9/]q\b"), "sed that quits early"),
]


def scripts(root):
    for pattern in ("tools/**/*.sh", "tests/**/*.sh", "bench/**/*.sh", ".ci/*"):
        for path in sorted(root.glob(pattern)):
            if path.is_file() and "build" not in path.relative_to(root).parts:
                yield path


def logical_lines(text):
    """Lines joined across backslash continuations, numbered by their first line."""
    start, parts = None, []
    for number, line in enumerate(text.splitlines(), 1):
        if start is None:
            start = number
        if line.endswith("\\"):
            parts.append(line[:-1])
            continue
        parts.append(line)
        yield start, " ".join(parts)
        start, parts = None, []
    if parts:
        yield start, " ".join(parts)


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    checked, problems = 0, 0
    for path in scripts(root):
        text = path.read_text(errors="replace")
        if not text.startswith("#!") or "sh" not in text.splitlines()[0]:
            continue
        checked += 1
        if "pipefail" not in text:
            continue
        for number, line in logical_lines(text):
            code = line.split(" #", 1)[0]
            if code.lstrip().startswith("#"):
                continue
            for pattern, what in EARLY_READERS:
                if pattern.search(code):
                    print(f"{path.relative_to(root)}:{number}: pipes into {what} under pipefail: "
                          f"{line.strip()}")
                    problems += 1
    print(f"{checked} scripts checked, {problems} problem{'s' if problems != 1 else ''}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
