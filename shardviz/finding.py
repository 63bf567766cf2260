"""The one shape every diagnosis takes, whether an FSDP2 rule or a cost check produced it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

SEVERITIES = ("error", "warning", "info")


class Change(NamedTuple):
    """A fix that is a change of the analysis' own arguments, as the check that found it priced it."""

    words: str  # what it does and what it gives, in a line: "checkpoint every block: fits, 32.45 GiB to spare; ..."
    kwargs: dict  # the arguments it replaces: any of plan=, mesh=, training= (``sv.analyze``'s)


@dataclass(frozen=True)
class Finding:
    code: str  # stable, e.g. "SV101"; tests and users grep for it
    severity: str  # "error" | "warning" | "info"
    message: str
    fqns: tuple[str, ...] = field(default=())
    fix: str = ""
    # how many names the finding is about in all: ``fqns`` may list only the first of them
    n_fqns: int | None = None
    # every name it is about (the Inspector filters its tree to them); ``fqns`` when not given
    all_fqns: tuple[str, ...] = field(default=(), compare=False, repr=False)
    # the fix as command-line flags ("--checkpoint blocks") when it is a change the command line can
    # make (plan, training, mesh, model dtype); "" otherwise (the fix then reads the same everywhere)
    flags: str = field(default="", compare=False)
    # its figures or fixes are still being priced (``checks.without_what_ifs``): the Inspector's first
    # findings, replaced by the priced ones a moment later
    pending: bool = field(default=False, compare=False)
    # the fix as a change of plan, mesh or training (``Change``), where the check priced it as one (SV201's
    # cheapest fix): what the Inspector's card applies; None when the fix is words, or ``fix_plan`` builds it
    change: Change | None = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        if self.severity not in SEVERITIES:
            raise ValueError(f"Finding {self.code}: severity must be one of {SEVERITIES}, got {self.severity!r}")
        object.__setattr__(self, "fqns", tuple(self.fqns))
        object.__setattr__(self, "all_fqns", tuple(self.all_fqns) or self.fqns)
        if self.n_fqns is None:
            object.__setattr__(self, "n_fqns", len(self.all_fqns))

    def fix_for(self, syntax: str = "python") -> str:
        """The fix in the syntax the user used: ``"cli"`` gives the flags where there are any."""
        return self.flags if syntax == "cli" and self.flags else self.fix

    def __str__(self) -> str:
        names = [f if f else "<root>" for f in self.fqns[:3]]
        where = f" [{', '.join(names)}{', ...' if len(self.fqns) > 3 else ''}]" if self.fqns else ""
        fix = f" Fix: {self.fix}" if self.fix else ""
        return f"{self.severity.upper()} {self.code}: {self.message}{where}{fix}"


class PlanError(ValueError):
    """torch would refuse this plan; ``findings`` holds every reason."""

    def __init__(self, findings: list[Finding]):
        self.findings = list(findings)
        super().__init__("\n".join(str(f) for f in self.findings))


#: What each code is about, in a few words: every surface that shows a code (the report, the
#: Inspector's findings) shows its title beside it, so no code is left unexplained. A new code
#: needs a title here (``tests/test_report_fixes.py`` reads every code the sources emit).
TITLES = {
    "SV000": "the checks themselves failed",
    "SV001": "a parameter reached by several fully_shard calls",
    "SV002": "a 0-dim parameter cannot be sharded",
    "SV003": "one call manages trainable parameters of several dtypes",
    "SV004": "a grouped call with no enclosing call becomes a second root",
    "SV005": "reshard_after_forward is not a divisor of the shard size",
    "SV006": "a tied parameter sharded under one name, whole under another",
    "SV007": "a call on a container without forward",
    "SV008": "a non-contiguous parameter",
    "SV101": "ignored parameters need torch 2.7 or later",
    "SV102": "trainable parameters ignored: their gradients are never reduced by FSDP",
    "SV103": "trainable parameters under no call: no gradient sync",
    "SV104": "frozen parameters under no call: whole on every rank",
    "SV105": "only the root is sharded: the whole model is gathered at once",
    "SV106": "one call's unsharded size dominates the parameter peak",
    "SV107": "padding wastes a large share of the shard",
    "SV108": "empty shards: parameters with fewer rows than ranks",
    "SV109": "a call that shards nothing (all its parameters ignored)",
    "SV110": "grouped calls need torch 2.5 or later",
    "SV111": "fully_shard needs torch 2.4 or later",
    "SV112": "trainable parameters both sharded and whole: one optimizer group fails",
    "SV113": "the step keeps a key/value cache",
    "SV120": "the adapter's target_modules miss this model's layers",
    "SV121": "the config declares float32 weights",
    "SV122": "quantized weights priced unquantized",
    "SV123": "4-bit weights cast by FSDP2's param_dtype",
    "SV124": "uint8 4-bit weights kept whole by accelerate",
    "SV125": "quantized weights left trainable",
    "SV128": "a torchao NF4 weight fully_shard cannot split over the mesh",
    "SV129": "float8 weights cast by FSDP2's param_dtype before the all-gather",
    "SV201": "the peak against the device memory",
    "SV202": "the allocator's reserved memory well above the allocated",
    "SV301": "the captured sharding code raised",
    "SV302": "a checkpointing policy shardviz does not model",
    "SV303": "no per-layer fully_shard calls",
    "SV304": "no reduce dtype in the framework's config",
    "SV305": "modules inside the blocks checkpointed, not the blocks",
    "SV306": "the framework casts trainable parameters to float32",
    "SV307": "the framework's config gives HSDP",
    "SV308": "calls on checkpoint wrappers that manage nothing",
    "SV309": "explicit prefetch settings recorded, default prefetch priced",
    "SV310": "Hugging Face's in-forward checkpointing and its use_reentrant",
    "SV311": "torchtune keeps weights, gradients and optimizer states in its dtype",
    "SV312": "axolotl's own fully_shard calls on the LoRA adapters",
    "SV313": "TRL's reference model: one root fully_shard call, not priced",
    "SV314": "a config key the framework ignores or refuses",
    "SV315": "a config setting read but not priced",
}


def title(code: str) -> str:
    """``code``'s title (``TITLES``); a code without one raises, naming it."""
    try:
        return TITLES[code]
    except KeyError:
        raise ValueError(f"finding code {code!r} has no title in shardviz.finding.TITLES") from None
