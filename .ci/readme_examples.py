"""Runs the `lemonade` examples of README.md's "Using it" block as written, against a running server.

Called by `.ci/newuser` right after the quick start, as the new user, with the server the quick start
left running and its Gemma 3 270M: `python readme_examples.py README.md MODEL`. Each example line is
run with the placeholders a reader fills in (MODEL, MODEL_A, ...) replaced by models that exist
offline; the examples that need the network (a download from Hugging Face) or a person (a foreground
server, a browser) are listed in SKIP with the reason, and the script fails if the README gains an
example it neither runs nor skips, or if one it runs exits non-zero.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

# Examples not run here, by their first words, and why.
SKIP = {
    "lemonade serve": "runs in the foreground until stopped (the quick start started the server already)",
    "lemonade pull Qwen3-0.6B-GGUF": "downloads from Hugging Face",
    "lemonade pull user.My": "downloads org/repo from Hugging Face (the checkpoint is a placeholder)",
    "lemonade pull org/MyKit": "downloads a collection file from Hugging Face (org/MyKit is a placeholder)",
    "lemonade load Whisper-Tiny-En-CT2": "downloads from Hugging Face",
    "lemonade load Whisper-Tiny": "downloads from Hugging Face",
    "lemonade speak": "downloads the Piper voice from Hugging Face",
    "lemonade import my-router.json": "a policy file the reader writes (docs/routing.md)",
}
STDIN = {"chat": "Hello\n"}  # piped into `lemonade chat`: one message, then end of input
# Added to `lemonade chat` unless the example sets it: the reply is bounded, as a reader at the terminal
# bounds it with Ctrl-C. The quick start's Gemma 3 270M is a base model: asked through the chat template
# (not `--base`), it may write until its 32,768-token context is full: once 11,800 tokens in 6 minutes
# and counting (a cold CI run, 2026-12-03), past this script's 10-minute limit per example.
BOUNDS = {"chat": ["--max-tokens", "256"]}


def examples(readme: Path) -> list[str]:
    text = readme.read_text(encoding="utf-8")
    section = text.split("## Using it", 1)[1]
    block = section.split("```bash", 1)[1].split("```", 1)[0]
    out: list[str] = []
    for line in block.splitlines():
        code = line.split("#", 1)[0].strip()
        for command in filter(None, (c.strip() for c in code.split(";"))):
            if command.startswith("lemonade "):
                out.append(command)
    return out


def main() -> int:
    readme, model = Path(sys.argv[1]), sys.argv[2]
    bindir = Path(sys.executable).parent
    # What a reader puts in for the placeholders: the model this machine has offline (the omni
    # collection example registers it twice, which needs no download).
    fill = {"MODEL": model, "MODEL_A": model, "MODEL_B": model, "[MODEL]": model}
    failed = 0
    for command in examples(readme):
        reason = next((why for head, why in SKIP.items() if command == head or command.startswith(head + " ")), None)
        if reason:
            print(f"readme: skipped  {command}  ({reason})")
            continue
        argv = [fill.get(word, word) for word in shlex.split(command)]
        argv[0] = str(bindir / "lemonade")
        bound = BOUNDS.get(argv[1], [])
        if bound and bound[0] not in argv:
            argv += bound
        done = subprocess.run(argv, input=STDIN.get(argv[1], ""), capture_output=True, text=True, timeout=600)
        status = "ok" if done.returncode == 0 else f"FAILED (exit {done.returncode})"
        print(f"readme: {status:8} {command}")
        if done.returncode != 0:
            failed += 1
            print(re.sub(r"^", "    ", (done.stdout + done.stderr)[-2000:], flags=re.M))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
