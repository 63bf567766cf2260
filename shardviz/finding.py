"""The one shape every diagnosis takes, whether an FSDP2 rule or a cost check produced it."""

from __future__ import annotations

from dataclasses import dataclass, field

SEVERITIES = ("error", "warning", "info")


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
