"""check_links.py refuses what it exists to refuse: in a scratch git tree, a README whose link
names a missing file and whose anchor names a missing heading, beside links that resolve (a
file, a heading, a repeated heading's second anchor)."""
import os
import subprocess
import sys
import tempfile

README = """# Title

## Set-up times

## Set-up times

[ok](docs/page.md) [ok](docs/page.md#a-heading-with-punctuation) [ok](#set-up-times-1)
[broken](docs/missing.md) [broken](docs/page.md#no-such-heading)

```
[not a link](inside/a/code/block.md)
```
"""
PAGE = "# A heading, with punctuation!\n\n[back](../README.md#title)\n"


def main():
    tool = sys.argv[1]
    with tempfile.TemporaryDirectory() as tree:
        os.makedirs(os.path.join(tree, "docs"))
        with open(os.path.join(tree, "README.md"), "w") as f:
            f.write(README)
        with open(os.path.join(tree, "docs", "page.md"), "w") as f:
            f.write(PAGE)
        subprocess.run(["git", "init", "-q", tree], check=True)
        run = subprocess.run([sys.executable, tool, tree], capture_output=True, text=True)
    print(run.stdout, end="")
    expected = ["README.md:8: docs/missing.md: no such file in the tree",
                "README.md:8: docs/page.md#no-such-heading: no heading #no-such-heading in "
                "docs/page.md", "6 links in 2 documents checked, 2 broken"]
    if run.returncode != 1 or any(e not in run.stdout for e in expected):
        print(f"FAIL: exit {run.returncode}, expected 1 and {expected}")
        return 1
    print("broken links refused, sound ones passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
