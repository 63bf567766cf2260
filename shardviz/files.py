"""Writing files so that nothing is ever half-written or silently clobbered."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_text_atomic(path, text: str, *, overwrite: bool = True, parents: bool = False) -> Path:
    """Write ``text`` to ``path`` all at once: readers see the old file or the new one, never half.

    A temporary file in the same folder is written and fsynced, then renamed over ``path``
    (``overwrite=True``) or hard-linked to it, which fails with ``FileExistsError`` if the name
    exists, also when another process created it meanwhile (``overwrite=False``). ``parents``: create
    the missing folders first (the widget's plan file; the CLI refuses a missing folder instead).
    """
    target = Path(path)
    folder = target.parent if str(target.parent) else Path(".")
    if parents:
        folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        if overwrite:
            os.replace(tmp, target)
        else:
            try:
                os.link(tmp, target)
            except FileExistsError:
                raise
            except OSError:  # a filesystem without hard links
                if target.exists():
                    raise FileExistsError(str(target)) from None
                os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    try:  # make the rename itself durable where the platform allows it
        dfd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass
    return target


def splice_between(text: str, generated: str, start: str, end: str) -> str:
    """``text`` with ``generated`` between the markers ``start`` and ``end`` (the markers stay):
    how the benchmark scripts keep the README's generated tables true."""
    if start not in text or end not in text:
        raise ValueError(f"the text lacks the markers {start} ... {end}")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{generated.strip()}\n{end}{tail}"
