"""How many shardviz files a newcomer follows from ``a.fit`` down to its numbers (CONTRIBUTING.md).

Counted, not guessed: the shardviz source files whose code runs while ``a.fit`` is read on a fresh
analysis (tiny Llama + LoRA, ``Plan.auto``, 4 H100 ranks), with ``--batch`` a micro-batch of 1 x 64
tokens (the activations measured too). ``--list`` prints them.

    .venv/bin/python scripts/count_fit_files.py [--batch] [--list]
"""

from __future__ import annotations

import sys
from pathlib import Path


def fit_files(batch: bool) -> list[str]:
    import shardviz as sv

    model = sv.zoo.tiny_llama_lora()
    training = sv.Training(batch_size=1, seq_len=64) if batch else None
    a = sv.analyze(model, sv.Plan.auto(model), sv.Mesh(4, device="H100"), training)
    root = Path(sv.__file__).parent
    seen = set()

    def profile(frame, event, arg):
        path = Path(frame.f_code.co_filename)
        if root in path.parents:
            seen.add(path.relative_to(root.parent).as_posix())

    sys.setprofile(profile)
    try:
        a.fit
    finally:
        sys.setprofile(None)
    return sorted(seen)


def main(argv: list[str]) -> int:
    files = fit_files("--batch" in argv)
    print(len(files))
    if "--list" in argv:
        print("\n".join(files))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
