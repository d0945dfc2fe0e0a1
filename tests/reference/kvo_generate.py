"""kvo-generate's greedy tokens after a prompt of token ids, for the reference checks."""
import json
import os
import subprocess
import sys
import tempfile


def generate_tokens(kvo_generate, model, ids, max_new, *args, with_json=False):
    """The new tokens of `kvo_generate --model model` after the prompt `ids` on the host backend,
    in prefill chunks of 128, with `args` added (with_json: its whole --json line instead); exits
    naming the arguments if it fails."""
    with tempfile.TemporaryDirectory() as tmp:
        prompt = os.path.join(tmp, "prompt.txt")
        with open(prompt, "w") as f:
            f.write(" ".join(map(str, ids)) + "\n")
        cmd = [kvo_generate, "--model", model, "--prompt-tokens", prompt, "--max-new",
               str(max_new), "--backend", "host", "--chunk", "128", *args, "--quiet", "--json"]
        run = subprocess.run(cmd, capture_output=True, text=True)
        if run.returncode != 0:
            print(run.stdout, run.stderr, file=sys.stderr)
            sys.exit(f"kvo-generate {' '.join(args)} failed")
        result = json.loads(run.stdout.strip().splitlines()[-1])
        return result if with_json else result["tokens"][0]
