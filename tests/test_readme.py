"""The README stays short and true: its limits, its links, its file table and its example's output."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_LINES, MAX_WIDTH = 120, 119  # issue 25: about 120 lines, every line under 120 characters
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _fenced(text: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", text, re.S | re.M)


def test_readme_is_short():
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_LINES, f"README.md has {len(lines)} lines; move reference material to docs/reference.md"
    wide = [f"line {n}: {len(line)} characters" for n, line in enumerate(lines, 1) if len(line) > MAX_WIDTH]
    assert wide == [], wide


@pytest.mark.parametrize("doc", ["README.md", "CONTRIBUTING.md", *sorted(p.relative_to(ROOT).as_posix()
                                                                          for p in (ROOT / "docs").glob("*.md"))])
def test_relative_links_point_at_files(doc):
    path = ROOT / doc
    targets = [t for t in LINK.findall(path.read_text()) if "://" not in t]
    missing = [t for t in targets if not (path.parent / t).exists()]
    assert missing == [], f"{doc} links to missing files: {missing}"


def test_every_module_is_in_both_file_tables():
    """Each top-level module and package of shardviz has a row in the README's table and in docs/files.md."""
    names = sorted(p.stem if p.is_file() else p.name for p in (ROOT / "shardviz").iterdir()
                   if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").exists())
    for doc in ("README.md", "docs/files.md"):
        rows = "\n".join(line for line in (ROOT / doc).read_text().splitlines() if line.startswith("| `"))
        missing = [n for n in names if not re.search(rf"`(shardviz/)?{n}(\.py|/)`", rows)]
        assert missing == [], f"{doc}'s file table lacks {missing}"


@pytest.mark.slow
def test_the_example_prints_what_the_readme_says():
    """The "Does it fit, and how fast?" example runs as written and prints the README's output block."""
    text = README.read_text()
    section = text.split("## Does it fit, and how fast?", 1)[1]
    code, = _fenced(section, "python")[:1]
    shown, = _fenced(section, "text")[:1]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md example", "exec"), {})
    assert out.getvalue() == shown, f"the README's example now prints:\n{out.getvalue()}"


@pytest.mark.slow
def test_the_demo_scripts_python_runs(tmp_path):
    """The README's first command, ``scripts/demo.sh``, ends in a Python program (its heredoc): it
    runs to the end with the installed package (the set-up and the report before it are the CLI's,
    tested in test_cli*). It broke once when ``a.step`` became a dataclass and nothing ran it."""
    import subprocess
    import sys

    text = (ROOT / "scripts" / "demo.sh").read_text(encoding="utf-8")
    program = text.split("<<'PY'\n", 1)[1].rsplit("\nPY", 1)[0]
    done = subprocess.run([sys.executable, "-c", program], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "tokens/s per rank" in done.stdout and "Open report.html" in done.stdout
