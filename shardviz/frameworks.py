"""Plans a framework makes: ``sv.Plan.from_accelerate`` runs the installed accelerate's own FSDP2
preparation through ``sv.capture``; ``to_accelerate`` writes the accelerate config that gives a plan.

Nothing of accelerate's rules is re-implemented here. The config goes through accelerate's own
launcher code (``accelerate.commands.launch._validate_launch_command`` then
``accelerate.utils.launch.prepare_multi_gpu_env``: the environment ``accelerate launch`` gives the
training processes); accelerate's ``FullyShardedDataParallelPlugin`` reads it, as in a real run;
then the model goes through the steps of ``Accelerator._prepare_fsdp2``: ``set_auto_wrap_policy``,
``fsdp2_apply_ac`` when activation checkpointing is on, ``fsdp2_prepare_model``. Those functions
read a handful of attributes of the ``Accelerator``; ``_AcceleratorState`` carries them (the plugin
with the mixed precision set as ``AcceleratorState`` sets it, the ``ParallelismConfig`` and its
device mesh, the mixed precision). The one step skipped is loading the weights
(``fsdp2_load_full_state_dict`` under ``fsdp_cpu_ram_efficient_loading``): a meta copy has none, and
it changes no call.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from dataclasses import replace

from torch import nn

from .capture import _LIBRARY_PARTS, as_mesh, run_captured
from .finding import Finding
from .plan import Origin, Plan

INSTALL = "pip install 'shardviz[accelerate]'"
#: A traceback frame in accelerate is the framework's line, not the user's: the finding names the YAML.
_ACCELERATE_LIBRARY = tuple(p for p in _LIBRARY_PARTS)


def accelerate_release() -> str:
    try:
        import accelerate
    except ImportError:
        raise ImportError(f"Plan.from_accelerate runs accelerate's own FSDP2 preparation; accelerate is not "
                          f"installed. Install it with: {INSTALL}") from None
    return accelerate.__version__


@contextlib.contextmanager
def _config_path(config, world: int):
    """A path to the YAML: the file given, or one written from an ``fsdp_config`` mapping."""
    if isinstance(config, (str, os.PathLike)):
        if not os.path.exists(config):
            raise ValueError(f"accelerate config {str(config)!r}: no such file")
        yield os.fspath(config)
        return
    if not isinstance(config, dict):
        raise ValueError(f"accelerate config: expected a YAML path or a mapping, got {type(config).__name__}")
    import yaml

    body = dict(config)
    if "fsdp_config" not in body:  # the fsdp_config mapping itself, plus mixed_precision
        body = {"fsdp_config": {k: v for k, v in body.items() if k != "mixed_precision"},
                "mixed_precision": body.get("mixed_precision", "no")}
    body.setdefault("distributed_type", "FSDP")
    body["fsdp_config"].setdefault("fsdp_version", 2)
    body.setdefault("num_processes", world)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "fsdp.yaml")
        with open(path, "w") as f:
            yaml.safe_dump(body, f)
        yield path


def launch_env(path: str, world: int) -> dict:
    """The environment ``accelerate launch --config_file path --num_processes world`` gives a process."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env

    args = launch_command_parser().parse_args(["--config_file", path, "--num_processes", str(world), "train.py"])
    args, _, _ = _validate_launch_command(args)
    env = prepare_multi_gpu_env(args)
    if env.get("ACCELERATE_USE_FSDP") != "true":
        raise ValueError(f"accelerate config {path!r}: distributed_type is not FSDP (accelerate set no FSDP)")
    if env.get("FSDP_VERSION", "1") != "2":
        raise ValueError(f"accelerate config {path!r}: fsdp_version is {env.get('FSDP_VERSION', '1')}; shardviz "
                         "models FSDP2 (fully_shard): set fsdp_config.fsdp_version: 2")
    return env


class _AcceleratorState:
    """What accelerate's FSDP2 functions read from an ``Accelerator``, built the way accelerate builds it."""

    def __init__(self, env: dict):
        from accelerate.parallelism_config import ParallelismConfig
        from accelerate.utils import FullyShardedDataParallelPlugin

        plugin = FullyShardedDataParallelPlugin()
        self.mixed_precision = env.get("ACCELERATE_MIXED_PRECISION", "no")
        if self.mixed_precision != "no":
            plugin.set_mixed_precision(self.mixed_precision)  # as AcceleratorState.__init__ does
        self.state = self
        self.fsdp_plugin = plugin
        use_pc = env.get("ACCELERATE_USE_PARALLELISM_CONFIG", "false").lower() == "true"
        self.parallelism_config = ParallelismConfig() if use_pc else None
        self.torch_device_mesh = self.parallelism_config.get_device_mesh("cuda") if use_pc else None
        self.is_main_process = True
        import torch

        # accelerate's device on rank 0 (cuda:0 on a GPU node); capture keeps meta tensors on meta either way
        self.device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


def accelerate_prepare(model: nn.Module, env: dict) -> nn.Module:
    """``Accelerator._prepare_fsdp2``'s steps for the model, under ``env`` (set here: capture restores it)."""
    from accelerate.utils import fsdp_utils

    os.environ.update(env)
    acc = _AcceleratorState(env)
    acc.fsdp_plugin.set_auto_wrap_policy(model)
    if acc.fsdp_plugin.activation_checkpointing:
        model = fsdp_utils.fsdp2_apply_ac(acc, model)
    load = fsdp_utils.fsdp2_load_full_state_dict
    fsdp_utils.fsdp2_load_full_state_dict = lambda *args, **kwargs: None  # weights: a meta copy has none
    try:
        return fsdp_utils.fsdp2_prepare_model(acc, model)
    finally:
        fsdp_utils.fsdp2_load_full_state_dict = load


def from_accelerate(model: nn.Module, config, world_size: int | None = None, mesh=None) -> Plan:
    """``Plan.from_accelerate``: the plan accelerate's own FSDP2 preparation makes (see the module docstring)."""
    release = accelerate_release()
    mesh = as_mesh(world_size, mesh)
    label = os.path.basename(os.fspath(config)) if isinstance(config, (str, os.PathLike)) else "fsdp_config"
    with _config_path(config, mesh.world) as path:
        env = launch_env(path, mesh.world)
    from .fsdp import Mesh

    pc_shape = _parallelism_shape(env, mesh.world)
    run_mesh = Mesh(shard=pc_shape[1], replicate=pc_shape[0]) if pc_shape else mesh
    cap = run_captured(accelerate_prepare, model, (env,), mesh=run_mesh, fn_name=f"accelerate {release}",
                       library=_ACCELERATE_LIBRARY)
    from .origin_checks import accelerate_fixes, capture_findings

    plan = cap.plan(Origin("accelerate", label, f"accelerate {release}", fixes=accelerate_fixes(env)))
    found = capture_findings(model, plan, env)
    if pc_shape:
        found.append(Finding("SV307", "info", f"the config's parallelism_config gives HSDP: {pc_shape[0]} replicas "
                             f"of {pc_shape[1]} shards", fix=f"analyse with sv.Mesh(shard={pc_shape[1]}, replicate={pc_shape[0]})"))
    return with_findings(plan, found)


def with_findings(plan: Plan, found) -> Plan:
    """The plan with these findings added to its origin's."""
    return replace(plan, origin=replace(plan.origin, findings=plan.origin.findings + tuple(found)))


def _parallelism_shape(env: dict, world: int):
    """(replicate, shard) from ``parallelism_config`` (HSDP), or None when the config has none."""
    if env.get("ACCELERATE_USE_PARALLELISM_CONFIG", "false").lower() != "true":
        return None
    replicate = int(env.get("PARALLELISM_CONFIG_DP_REPLICATE_SIZE", "1"))
    shard = int(env.get("PARALLELISM_CONFIG_DP_SHARD_SIZE", "1"))
    if replicate * shard != world:
        raise ValueError(f"parallelism_config: dp_replicate_size {replicate} x dp_shard_size {shard} = "
                         f"{replicate * shard}, not the world of {world} ranks")
    return replicate, shard
