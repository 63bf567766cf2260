"""shardviz: see what PyTorch FSDP2's ``fully_shard`` does to a model before training it."""

from .analysis import Analysis, analyze
from .checks import fix_plan
from .codegen import export_code
from .compare import Comparison, Sweep, compare, sweep
from .cost import Training
from .devices import Device, Efficiency
from .finding import Finding, PlanError
from .fsdp import Mesh
from .plan import Plan, Unit
from .tree import ModelTree
from . import zoo  # sv.zoo: example models, no download (transformers is imported when one is built)
from .load import load_model

__all__ = [
    "Analysis", "Comparison", "Finding", "Inspector", "Mesh", "ModelTree", "Plan", "PlanError", "Sweep",
    "Training", "Unit", "analyze", "compare", "export_code", "fix_plan", "load_model", "sweep", "verify", "zoo",
]
__all__ += ["Device", "Efficiency"]  # step time: sv.Mesh(device=...), docs/step-time.md
__version__ = "0.1.0"


def verify(model, plan, mesh=None, ranks=None):
    """Apply ``plan`` with torch's real ``fully_shard`` to a meta copy and list disagreements with ``analyze``."""
    from .oracle import verify as _verify

    return _verify(model, plan, mesh=mesh, ranks=ranks)


def __getattr__(name):
    # The widget pulls in anywidget and ipywidgets: imported on first use of ``sv.Inspector`` only,
    # so scripts and the command line never pay for them.
    if name == "Inspector":
        from .widget import Inspector

        return Inspector
    raise AttributeError(f"module 'shardviz' has no attribute {name!r}")
