"""shardviz: see what PyTorch FSDP2's ``fully_shard`` does to a model before training it."""

from .analysis import Analysis, analyze
from .export.codegen import export_code
from .compare import Comparison, Sweep, compare, sweep
from .run.training import Training
from .run.devices import Device, Efficiency
from .finding import Finding, PlanError
from .checks.fixes import fix_plan
from .format import fmt  # any table for reading: sv.fmt(a.memory)
from .run.mesh import Mesh
from .plan import Plan, Unit
from .search import Search, search
from .model.tree import ModelTree
from . import tp  # sv.tp: the tensor-parallel rules (styles, TP-local shapes)
from . import zoo  # sv.zoo: example models, no download (transformers is imported when one is built)
from .model.load import load_model
from .export.oracle import verify
from .frameworks.capture import capture
from .frameworks.trainer_config import from_trainer  # a Trainer / TRL run's arguments, read by transformers
from .frameworks.torchtune_config import from_torchtune  # a torchtune recipe, read by torchtune (its own venv)
from .frameworks.axolotl_config import from_axolotl  # an axolotl YAML, read by axolotl (its own venv)
from .presets import auto_plan  # sv.auto_plan(model, lora=..., checkpoint=..., tensor_parallel=...)
from .frameworks import FrameworkSetup, from_accelerate, to_accelerate  # a framework's own preparation, run through capture

# Plan's documented entries whose code lives above plan.py in the layers (presets, frameworks):
# attached here, where the package is assembled, so plan.py imports nothing above it.
Plan.auto = staticmethod(auto_plan)
Plan.from_accelerate = staticmethod(from_accelerate)


def _plan_to_accelerate(self, model, world_size: int = 8) -> tuple[str, list[str]]:
    """(YAML, what it cannot express): the accelerate config closest to this plan, checked by running
    the installed accelerate on it (``sv.to_accelerate(model, plan)``)."""
    return to_accelerate(model, self, world_size)


Plan.to_accelerate = _plan_to_accelerate

__all__ = [
    "Analysis", "Comparison", "capture", "Finding", "Inspector", "Mesh", "ModelTree", "Plan", "PlanError", "Search", "Sweep",
    "Training", "Unit", "analyze", "compare", "export_code", "fix_plan", "fmt", "load_model", "search", "sweep", "verify",
    "zoo",
]
__all__ += ["Device", "Efficiency"]  # step time: sv.Mesh(device=...), docs/step-time.md
__all__ += ["FrameworkSetup", "from_trainer", "from_torchtune", "from_axolotl"]  # sv.from_trainer(args or a YAML of them, model, world_size)
__all__ += ["auto_plan", "from_accelerate", "to_accelerate"]  # also Plan.auto / from_accelerate / to_accelerate
__all__ += ["tp"]  # tensor parallelism: sv.tp, Plan.tensor_parallel, Mesh(tensor=T)
__version__ = "0.1.0"


def __getattr__(name):
    # The widget pulls in anywidget and ipywidgets: imported on first use of ``sv.Inspector`` only,
    # so scripts and the command line never pay for them.
    if name == "Inspector":
        from .widget import Inspector

        return Inspector
    raise AttributeError(f"module 'shardviz' has no attribute {name!r}")
