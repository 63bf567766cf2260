"""What the command line prints: answers on stdout, progress and context on stderr, never mixed.

- ``quiet_libraries``: transformers', peft's and torch's own warnings are not the user's answer;
  shardviz's own warnings still show;
- ``say`` (stderr, "shardviz: ..." lines) flushes stdout first, ``answer`` (stdout) flushes after,
  so the two streams never interleave mid-line in a terminal;
- ``report_lines``: the report's verdict, peak, step time and top findings, fixes written as the
  command line's flags (``Finding.fix_for("cli")``);
- ``table_text``: a table cut to ``WIDTH`` columns (long cells shortened with "…").
"""

from __future__ import annotations

import contextlib
import os
import sys
import textwrap

from ..libraries import quiet_messages
from ..views import display

WIDTH = 100
TOP_FINDINGS = 5


_QUIET_ENV = {"TRANSFORMERS_VERBOSITY": "error", "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1"}


@contextlib.contextmanager
def quiet_libraries():
    """While the command runs: the libraries' warnings hidden (transformers' logger too), shardviz's
    own kept; the process's warning filters, environment and transformers' verbosity are put back
    afterwards (``main`` may be called from Python, e.g. by the tests)."""
    saved_env = {k: os.environ.get(k) for k in _QUIET_ENV}
    for key, value in _QUIET_ENV.items():
        os.environ.setdefault(key, value)
    hf_logging = sys.modules["transformers"].logging if "transformers" in sys.modules else None
    verbosity = hf_logging.get_verbosity() if hf_logging is not None else None
    try:  # the libraries' loggers pass only their errors, and only shardviz's warnings show
        with quiet_messages():
            if hf_logging is not None:
                hf_logging.set_verbosity_error()
            yield
    finally:
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if hf_logging is not None:
            hf_logging.set_verbosity(verbosity)
        elif "transformers" in sys.modules:  # imported during the command, quiet from its env: back to its default
            sys.modules["transformers"].logging.set_verbosity_warning()


def say(text: str) -> None:
    """One line of context or progress on stderr, after whatever stdout holds."""
    sys.stdout.flush()
    print(f"shardviz: {text}", file=sys.stderr, flush=True)


def answer(text: str, stream=None) -> None:
    """Lines of the answer (stdout unless ``stream``), flushed before anything else is said."""
    stream = stream or sys.stdout
    sys.stderr.flush()
    stream.write(text if text.endswith("\n") else text + "\n")
    stream.flush()


def _cut(text: str, width: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


def _wrap(text: str, indent: str = "", width: int = WIDTH) -> list[str]:
    """``text`` in lines of at most ``width`` columns, the later ones indented two more than the first."""
    return textwrap.wrap(" ".join(str(text).split()), width, initial_indent=indent, subsequent_indent=indent + "    ",
                         break_on_hyphens=False) or [indent]


def finding_lines(findings, top: int = TOP_FINDINGS, width: int = WIDTH) -> list[str]:
    """The first ``top`` findings (errors first, as ``run_checks`` orders them), each with its fix as
    flags where it has them; a count of the rest."""
    if not findings:
        return ["findings: none"]
    lines = [f"findings ({len(findings)}" + (f", the first {top}" if len(findings) > top else "") + "):"]
    for f in findings[:top]:
        lines += _wrap(f"{f.severity} {f.code}: {f.message}", "  ", width)
        fix = f.fix_for("cli")
        if fix:
            lines += _wrap(f"fix: {fix}", "    ", width)
    if len(findings) > top:
        lines.append(f"  ... {len(findings) - top} more in the report")
    return lines


def seq_len_warning(tree, training) -> str | None:
    """"warning: sequence length ... above max_position_embeddings" (``display.seq_len_note``, the
    Inspector's words) when the micro-batch's sequences are longer than the model's positions."""
    note = display.seq_len_note(tree.model, training.seq_len) if training.batch_size or training.global_batch else None
    return f"warning: {note}" if note else None


def _step_line(a) -> str:
    """``display.step_text``; without a step time for want of a micro-batch, the flags that give one."""
    if a.step.step_time_s is None and not a.training.with_activations:
        return "step time: none without a micro-batch (--batch-size B --seq-len S; and --device for the FLOPS)"
    return display.step_text(a.step)


def report_lines(a, findings, context: list[str] = (), label: str | None = None) -> list[str]:
    """What ``shardviz report`` answers in the terminal: the model, the verdict, the step, the
    assumptions (``context``), then the top findings; no line over ``WIDTH`` columns."""
    lines = [f"model: {display.model_text(a.tree, label)}", f"plan: {a.plan.name or 'custom'} ({len(a.plan.units)} fully_shard calls)",
             *context, f"verdict: {display.verdict_text(a)}", _step_line(a)]
    note = seq_len_warning(a.tree, a.training)
    if note:
        lines.append(note)
    return [w for line in lines for w in _wrap(line)] + finding_lines(findings)


def table_text(df, width: int = WIDTH, shrink: str | None = None, wrap: bool = False, notes=None) -> str:
    """``df`` as text no wider than ``width``: the ``shrink`` column (else the widest) is cut to what is
    left, or with ``wrap`` wrapped onto more lines (a name is never cut); ``notes``: one text per row
    (or "") printed under it, indented and wrapped (e.g. why a row has no numbers)."""
    df = df.astype(str)
    cols = list(df.columns)
    widths = {c: max([len(c), *df[c].map(len)]) for c in cols}
    shrink = shrink if shrink in cols else max(cols, key=lambda c: widths[c])
    others = sum(widths[c] for c in cols if c != shrink) + 2 * (len(cols) - 1)
    widths[shrink] = max(min(widths[shrink], width - others), 8)
    fit = lambda c, v: _cut(v, widths[c]) if c != shrink or not wrap else v  # noqa: E731
    line = lambda cells: "  ".join(  # noqa: E731
        fit(c, v).ljust(widths[c]) if c == cols[0] or c == shrink else fit(c, v).rjust(widths[c])
        for c, v in zip(cols, cells)).rstrip()
    out = [line(cols)]
    for i, row in enumerate(df.itertuples(index=False)):
        cells = list(row)
        at = cols.index(shrink)
        parts = (textwrap.wrap(" ".join(cells[at].split()), widths[shrink], break_on_hyphens=False) or [""]) if wrap else [cells[at]]
        out.append(line([*cells[:at], parts[0], *cells[at + 1:]]))
        pad = sum(widths[c] + 2 for c in cols[:at])
        out += [" " * pad + part for part in parts[1:]]
        if notes is not None and notes[i]:
            out += _wrap(notes[i], " " * (pad + 2), width)
    return "\n".join(out)
