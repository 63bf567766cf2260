"""The Inspector's plan file: saved atomically after every change, restored on the next start.

Rules (the Inspector's "nothing lost" promise):

- a save writes a temporary file in the same folder, flushes and fsyncs it, then ``os.replace``s
  it over the plan file: a crash at any moment leaves either the old plan or the new one, never
  half a file;
- on start, a valid file that names only modules and parameters of this model is restored;
- a file that is not a valid plan (corrupt JSON, wrong schema) or that names modules or
  parameters this model does not have (every one is listed) is *never* overwritten silently:
  autosave stays off and the message says so, until the user explicitly overwrites it
  (``overwrite``) or picks another path;
- a file whose calls miss some of the model's repeated blocks while covering their siblings (a
  plan made for a model with fewer layers, or an edit that left a block out) is restored, with an
  error message naming the blocks and the call that would gather them;
- a file changed by someone else since we last read or wrote it (another Inspector, an editor)
  is not overwritten silently either: the save is refused the same way;
- what a version-2 file records of the run (its "mesh" and "training", from ``shardviz plan
  search``) is written back with every later save, so editing the plan keeps them; version-1
  files read as before.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from ..files import write_text_atomic
from ..plan import Plan


class PlanFileError(ValueError):
    """The plan file cannot be used; autosave is off until the user decides."""


def _digest(data: bytes | None) -> str | None:
    return None if data is None else hashlib.sha256(data).hexdigest()


@dataclass
class LoadResult:
    plan: Plan | None  # the restored plan, or None (no file, or unusable)
    level: str  # "info" | "error"
    message: str


class PlanFile:
    """One plan file on disk and whether we may write it."""

    def __init__(self, path):
        self.path = Path(path).expanduser()
        self.writable = True  # False after a corrupt/mismatched/conflicting file: never overwrite silently
        self.problem: str | None = None
        self._known: str | None = None  # digest of the content we last read or wrote (None: no file)
        self.saves = 0
        self.setup: dict = {}  # the "mesh" and "training" the file recorded, kept through later saves

    # -- reading ---------------------------------------------------------------------------
    def _read_bytes(self) -> bytes | None:
        try:
            return self.path.read_bytes()
        except FileNotFoundError:
            return None

    def load(self, tree) -> LoadResult:
        """Read the file; a usable plan comes back, anything else switches autosave off."""
        data = self._read_bytes()
        self._known = _digest(data)
        if data is None:
            return LoadResult(None, "info", f"plan file {self.path} does not exist yet; it will be created on the first change")
        try:
            plan = Plan.from_json(data.decode("utf-8"))
        except (ValueError, UnicodeDecodeError) as exc:
            return self.refuse(f"plan file {self.path} is not a valid shardviz plan ({exc})")
        from ..presets import blocks_without_calls, plan_mismatch

        problems = plan_mismatch(tree, plan)
        gaps = blocks_without_calls(tree, plan)
        if problems and not (gaps and len(problems) == 1):  # names this model lacks: another model's plan
            return self.refuse(f"plan file {self.path} does not match this model ({'; '.join(problems)})")
        try:
            plan.validate(tree)
        except ValueError as exc:
            return self.refuse(f"plan file {self.path} does not match this model ({exc})")
        self.writable, self.problem = True, None
        self.setup = dict(plan.setup)
        restored = f"restored {len(plan.units)} units and {len(plan.ignored)} ignored parameters from {self.path}"
        if gaps:  # an edit here can leave a block out too: restored (nothing lost), said as an error
            return LoadResult(plan, "error", f"{restored}, but {problems[0]}")
        return LoadResult(plan, "info", restored)

    def refuse(self, why: str) -> LoadResult:
        self.writable = False
        self.problem = (
            f"{why}. It was left untouched and autosave is OFF: overwrite it with the current plan "
            "explicitly, or choose another plan_path."
        )
        return LoadResult(None, "error", self.problem)

    # -- writing ---------------------------------------------------------------------------
    def save(self, plan: Plan) -> bool:
        """Save ``plan`` atomically if we may; False (and ``problem`` set) when we may not."""
        if not self.writable:
            return False
        current = self._read_bytes()
        if _digest(current) != self._known:
            self.writable = False
            self.problem = (
                f"plan file {self.path} was changed by someone else since this Inspector last read or "
                "wrote it. It was left untouched and autosave is OFF: overwrite it with the current plan "
                "explicitly, or choose another plan_path."
            )
            return False
        self._write(plan)
        return True

    def overwrite(self, plan: Plan) -> None:
        """The user's explicit decision: replace whatever is there and switch autosave back on."""
        self._write(plan)
        self.writable, self.problem = True, None

    def _write(self, plan: Plan) -> None:
        text = plan.to_json(setup=plan.setup or self.setup) + "\n"
        write_text_atomic(self.path, text, parents=True)
        self._known = _digest(text.encode("utf-8"))
        self.saves += 1
