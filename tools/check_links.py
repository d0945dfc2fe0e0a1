#!/usr/bin/env python3
"""Checks every relative link of the project's documents: README.md, CONTRIBUTING.md, docs/*.md
and the READMEs of the tree. A link's file must exist (relative to the document), and its anchor
(#...) must be a heading of that file as GitHub names it (lowercase, punctuation dropped, spaces
as hyphens, a repeated heading numbered -1, -2, ...). Links inside code blocks and to other
sites (http:, https:, mailto:) are not checked. Prints each broken link and exits 1; 0 when
there is none.

    check_links.py [ROOT]
"""
import os
import re
import subprocess
import sys

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def text_outside_code(path):
    out, fenced = [], False
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if line.lstrip().startswith("```"):
                fenced = not fenced
                continue
            if not fenced:
                out.append((number, re.sub(r"`[^`]*`", "", line)))
    return out


def anchors(path):
    seen, found = {}, set()
    for _, line in text_outside_code(path):
        m = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(2).strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        found.add(slug if n == 0 else f"{slug}-{n}")
    return found


def documents(root):
    files = subprocess.run(["git", "-C", root, "ls-files", "--cached", "--others",
                            "--exclude-standard"], capture_output=True, text=True,
                           check=True).stdout.split()
    return sorted(f for f in files if f.endswith(".md") and (
        f in ("README.md", "CONTRIBUTING.md") or f.startswith("docs/") or
        f.endswith("/README.md")))


def main(argv):
    root = os.path.abspath(argv[1] if len(argv) > 1 else
                           os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    problems = links = 0
    docs = documents(root)
    for doc in docs:
        path = os.path.join(root, doc)
        for number, line in text_outside_code(path):
            for target in LINK.findall(line):
                if re.match(r"^(https?|mailto):", target):
                    continue
                links += 1
                file_part, _, anchor = target.partition("#")
                where = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) \
                    if file_part else path
                if not where.startswith(os.path.abspath(root)) or not os.path.exists(where):
                    print(f"{doc}:{number}: {target}: no such file in the tree")
                    problems += 1
                    continue
                if anchor and (not where.endswith(".md") or anchor not in anchors(where)):
                    print(f"{doc}:{number}: {target}: no heading #{anchor} in "
                          f"{os.path.relpath(where, root)}")
                    problems += 1
    print(f"check_links: {links} links in {len(docs)} documents checked, {problems} broken")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
