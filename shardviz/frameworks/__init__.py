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
from dataclasses import dataclass, field, replace

from torch import nn

from .capture import as_mesh, run_captured
from ..finding import Finding
from ..plan import Origin, Plan

INSTALL = "pip install 'shardviz[accelerate]'"
#: the findings a framework's own code gives (SV310-SV315), in its keys; the rest of the plan's are capture's
FRAMEWORK_CODES = ("SV310", "SV311", "SV312", "SV313", "SV314", "SV315")


@dataclass(frozen=True)
class FrameworkSetup:
    """What ``sv.from_trainer``, ``sv.from_axolotl`` and ``sv.from_torchtune`` read, one record for all three:
    ``framework`` ("trainer", "axolotl", "torchtune"), the ``model`` (built on meta, or the one given), the
    ``plan`` the framework's own preparation makes, the ``mesh``, the ``sv.Training``, ``origins`` (each
    field -> where its value came from: the file, an override, the framework's default, shardviz's
    default), ``config`` (the framework's own reading of the file: ``TrainingArguments`` / TRL's config,
    axolotl's validated config, torchtune's ``DictConfig``) and ``others``: other models the framework
    shards beside the one trained ({"reference model": Plan}, TRL's DPO/KTO/GRPO). What the framework does
    that the numbers do not show is in ``findings`` (SV310-SV315, each naming the key to change), carried
    by the plan, so ``a.findings`` and ``shardviz report`` show them."""

    framework: str
    model: nn.Module
    plan: Plan
    mesh: object
    training: object
    origins: dict
    config: object
    others: dict = field(default_factory=dict)

    @property
    def findings(self) -> tuple:
        """The framework's findings (SV310-SV315) among the plan's."""
        return tuple(f for f in (self.plan.origin.findings if self.plan.origin else ()) if f.code in FRAMEWORK_CODES)


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

    def __init__(self, env: dict, plugin=None):
        from accelerate.parallelism_config import ParallelismConfig
        from accelerate.utils import FullyShardedDataParallelPlugin

        plugin = plugin if plugin is not None else FullyShardedDataParallelPlugin()
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


def accelerator_for(env: dict, plugin=None):
    """What accelerate's FSDP2 functions (and TRL's ``prepare_fsdp``) read from an ``Accelerator``, as
    accelerate builds it from ``env`` and ``plugin``."""
    return _AcceleratorState(env, plugin)


def accelerate_prepare(model: nn.Module, env: dict, plugin=None) -> nn.Module:
    """``Accelerator._prepare_fsdp2``'s steps for the model, under ``env`` (set here: capture restores it);
    ``plugin``: the ``FullyShardedDataParallelPlugin`` given to the ``Accelerator`` (the Trainer's), else
    the one accelerate builds from ``env``."""
    from accelerate.utils import fsdp_utils

    os.environ.update(env)
    acc = _AcceleratorState(env, plugin)
    acc.fsdp_plugin.set_auto_wrap_policy(model)
    if acc.fsdp_plugin.activation_checkpointing:
        model = fsdp_utils.fsdp2_apply_ac(acc, model)
    load, logger = fsdp_utils.fsdp2_load_full_state_dict, fsdp_utils.logger
    fsdp_utils.fsdp2_load_full_state_dict = lambda *args, **kwargs: None  # weights: a meta copy has none
    # accelerate's logger refuses to log without a PartialState (the stand-in is none): its own logging.Logger logs
    # the fp32 upcast message instead of raising
    fsdp_utils.logger = getattr(logger, "logger", logger)
    try:
        return fsdp_utils.fsdp2_prepare_model(acc, model)
    finally:
        fsdp_utils.fsdp2_load_full_state_dict, fsdp_utils.logger = load, logger


def from_accelerate(model: nn.Module, config, world_size: int | None = None, mesh=None) -> Plan:
    """``Plan.from_accelerate``: the plan accelerate's own FSDP2 preparation makes (see the module docstring)."""
    release = accelerate_release()
    mesh = as_mesh(world_size, mesh)
    label = os.path.basename(os.fspath(config)) if isinstance(config, (str, os.PathLike)) else "fsdp_config"
    with _config_path(config, mesh.world) as path:
        body = _read_yaml(path)
        if looks_like_axolotl(body):
            raise ValueError(f"accelerate config {label}: this is an axolotl config ({', '.join(looks_like_axolotl(body))}"
                             "): use --axolotl-config (sv.from_axolotl)")
        try:
            env = launch_env(path, mesh.world)
        except ValueError as exc:  # accelerate's launcher refused a value (a bool key given a word)
            if "accelerate config" in str(exc):
                raise
            raise config_error(label, str(exc), body, model, release) from None
    from ..run.mesh import Mesh

    pc_shape = _parallelism_shape(env, mesh.world)
    run_mesh = Mesh(shard=pc_shape[1], replicate=pc_shape[0]) if pc_shape else mesh
    # the SV301 line of an error is accelerate's (outside torch and shardviz); its fix is the config's
    cap = run_captured(accelerate_prepare, model, (env,), mesh=run_mesh, fn_name=f"accelerate {release}")
    if cap.error is not None:  # accelerate's line is not the user's to change: the fix is the config's
        cap.error = replace(cap.error, fix=_config_fix(cap.error.message, model, label))
    from ..checks.origin_checks import accelerate_fixes, capture_findings

    plan = cap.plan(Origin("accelerate", label, f"accelerate {release}", fixes=accelerate_fixes(env)))
    if cap.error is not None:  # accelerate launch would stop here: no plan to price
        raise config_error(label, cap.error.message, body, model, release, env, plan, cap.error)
    found = capture_findings(model, plan, env, cap.cast, f"accelerate {release}")
    if pc_shape:
        found.append(Finding("SV307", "info", f"the config's parallelism_config gives HSDP: {pc_shape[0]} replicas "
                             f"of {pc_shape[1]} shards", fix=f"analyse with sv.Mesh(shard={pc_shape[1]}, replicate={pc_shape[0]})"))
    return with_findings(plan, found)


#: keys only an axolotl YAML has (``--accelerate-config`` given one says so)
AXOLOTL_KEYS = ("base_model", "adapter", "datasets", "micro_batch_size", "sequence_len", "lora_r")


def looks_like_axolotl(body: dict) -> list[str]:
    """The axolotl-only keys of a YAML mapping (empty for an accelerate config)."""
    return [k for k in AXOLOTL_KEYS if isinstance(body, dict) and k in body]


class AccelerateConfigError(ValueError):
    """accelerate's own preparation raised on this config: ``accelerate launch`` would stop at start-up,
    so there is no plan to price. ``key`` (``fsdp_config.fsdp_auto_wrap_policy``) and ``value``: what
    the config says that accelerate refused (None when the error names no key); ``closest``: a valid
    value near it (None when none is known); ``finding``: the SV301 finding (accelerate's line);
    ``plan``: the calls accelerate had made until it raised."""

    def __init__(self, message: str, key=None, value=None, closest=None, finding=None, plan=None):
        super().__init__(message)
        self.key, self.value, self.closest, self.finding, self.plan = key, value, closest, finding, plan


def _read_yaml(path: str) -> dict:
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            body = yaml.safe_load(f)
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"accelerate config {path!r}: not readable YAML ({' '.join(str(exc).split())})") from None
    return body if isinstance(body, dict) else {}


def _config_fields(body: dict) -> list[tuple[str, object]]:
    """(key as the YAML nests it, value) for the fsdp_config's keys, then the top level's plain values."""
    fsdp = body.get("fsdp_config") if isinstance(body.get("fsdp_config"), dict) else {}
    top = [(k, v) for k, v in body.items() if k not in ("fsdp_config", "distributed_type") and not isinstance(v, (dict, list))]
    return [(f"fsdp_config.{k}", v) for k, v in fsdp.items()] + top


def _named_value(message: str, body: dict):
    """(key, value) of the config whose value the error message names (the longest such value), or (None, None)."""
    import re

    low = message.lower()
    hits = []
    for key, value in _config_fields(body):
        for item in (str(value).split(",") if isinstance(value, str) else []):
            item = item.strip()
            if item and re.search(r"(?<![\w])" + re.escape(item.lower()) + r"(?![\w])", low):
                hits.append((len(item), key, item))
    if not hits:
        return None, None
    _, key, item = max(hits)
    return key, item


#: FSDP1's sharding strategies given where FSDP2 wants a bool (fsdp_reshard_after_forward): the bool they mean.
FSDP1_STRATEGIES = {"FULL_SHARD": "true", "HYBRID_SHARD": "true", "SHARD_GRAD_OP": "false",
                    "_HYBRID_SHARD_ZERO2": "false", "NO_SHARD": "false"}


def _closest(key: str, value: str, message: str, model: nn.Module):
    """A valid value near ``value``: from the list accelerate's message gives, the model's module
    classes for the layer class, true/false for a bool key; None when none is known."""
    import difflib
    import re

    listed = re.search(r"one of \[([^\]]*)\]", message)
    if listed:
        choices = re.findall(r"'([^']*)'", listed.group(1))
        return next(iter(difflib.get_close_matches(value, choices, n=1, cutoff=0.0)), None)
    if key.endswith("transformer_layer_cls_to_wrap"):
        from ..presets import find_blocks
        from ..model.tree import as_tree

        tree = as_tree(model)
        blocks = sorted({tree.modules[b].type_name for b in find_blocks(tree)})
        classes = sorted({m.type_name for m in tree.modules})
        near = difflib.get_close_matches(value, classes, n=1, cutoff=0.6)
        return near[0] if near else (blocks[0] if blocks else None)
    if "truth value" in message:
        return FSDP1_STRATEGIES.get(value.upper(), "true or false")
    return None


def config_error(label: str, message: str, body: dict, model: nn.Module, release: str, env=None, plan=None,
                 finding=None, kind: str = "accelerate config") -> AccelerateConfigError:
    """The refusal of a config accelerate's preparation raises on, naming the key, its value and the
    closest valid one (``AccelerateConfigError``)."""
    said = message.replace(" The plan below is what it had done until then.", "").rstrip(".")
    key, value = _named_value(said, body)
    closest = _closest(key, value, said, model) if key else None
    if key is None and (env or {}).get("FSDP_AUTO_WRAP_POLICY") == "SIZE_BASED_WRAP":
        key, value = "fsdp_config.fsdp_min_num_params", str(env.get("FSDP_MIN_NUM_PARAMS"))
        what = (f"{key} is {value}: accelerate's SIZE_BASED_WRAP then also matches a ModuleList of layers, "
                "which fully_shard refuses (use fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP, or raise fsdp_min_num_params)")
    elif key is None:
        what = "accelerate's FSDP2 preparation fails on it"
    else:
        hint = ("" if closest is None else f" (with fsdp_version 2 it is a bool: {closest})" if "truth value" in said
                else f" (did you mean {closest!r}?)")
        what = f"{key} is {value!r}, which accelerate refuses{hint}"
    launcher = "accelerate launch" if kind == "accelerate config" else "transformers' Trainer"
    text = (f"{kind} {label}: {what}. {said.removeprefix(f'accelerate {release} raised ')} "
            f"(accelerate {release}). {launcher} would stop at start-up with this config: there is no plan to price")
    return AccelerateConfigError(text, key, value, closest, finding, plan)


def _config_fix(message: str, model: nn.Module, label: str) -> str:
    from ..presets import find_blocks
    from ..model.tree import as_tree

    if "Could not find the transformer layer class" in message:
        tree = as_tree(model)
        classes = sorted({tree.modules[b].type_name for b in find_blocks(tree)})
        return (f"in {label}, set fsdp_config.fsdp_transformer_layer_cls_to_wrap to a class the model has"
                + (f": {', '.join(classes)}" if classes else ""))
    return f"change {label} (the accelerate config) so that accelerate's preparation succeeds"


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


def import_function(spec: str):
    """``my_train:apply_fsdp`` (``package.module:function``) -> the function; the current folder is importable."""
    from ..model.load import import_object

    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"--plan-from {spec!r}: expected module:function, e.g. my_train:apply_fsdp")
    obj = import_object(module_name, attr, f"--plan-from {spec!r}")
    if not callable(obj):
        raise ValueError(f"--plan-from {spec!r}: {attr!r} is not a function")
    return obj


def plan_from_source(model: nn.Module, mesh, accelerate_config=None, plan_from=None) -> Plan:
    """The command line's captured plan: ``--accelerate-config fsdp.yaml`` or ``--plan-from module:function``
    (called as ``function(model)``, or ``function(model, mesh)`` when it takes a second argument: the
    torch DeviceMesh of the ranks given)."""
    import inspect

    if accelerate_config is not None:
        return from_accelerate(model, accelerate_config, mesh=mesh)
    from .capture import capture

    fn = import_function(plan_from)
    try:
        required = [p for p in inspect.signature(fn).parameters.values()
                    if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        required = [None]
    args = (mesh,) if len(required) >= 2 else ()
    return capture(fn, model, *args, mesh=mesh)


def accelerate_config(tree, plan: Plan) -> dict:
    """The accelerate config closest to ``plan``: per-layer calls by the blocks' class, its precision,
    offload, reshard and activation checkpointing."""
    from ..presets import find_blocks

    blocks = [tree.modules[b] for b in find_blocks(tree)]
    block_units = [plan.unit_of(b.fqn) for b in blocks]
    fsdp = {"fsdp_version": 2, "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP" if any(block_units) else "NO_WRAP",
            "fsdp_offload_params": bool(plan.units) and all(u.offload for u in plan.units),
            "fsdp_reshard_after_forward": next((u.reshard_after_forward is not False for u in block_units if u), True),
            "fsdp_state_dict_type": "SHARDED_STATE_DICT", "fsdp_cpu_ram_efficient_loading": True,
            "fsdp_activation_checkpointing": bool(blocks) and all(b.fqn in plan.checkpoint for b in blocks)}
    if any(block_units):
        fsdp["fsdp_transformer_layer_cls_to_wrap"] = ",".join(dict.fromkeys(b.type_name for b in blocks))
    dtypes = {u.param_dtype for u in plan.units} - {None}
    mixed = {"bfloat16": "bf16", "float16": "fp16"}.get(next(iter(dtypes)), "no") if len(dtypes) == 1 else "no"
    return {"compute_environment": "LOCAL_MACHINE", "distributed_type": "FSDP", "mixed_precision": mixed,
            "fsdp_config": fsdp}


def _resolved(unit):
    """A non-root call's ``reshard_after_forward=None`` is True (torch >= 2.8): the same call either way."""
    return replace(unit, reshard_after_forward=True) if unit.reshard_after_forward is None and "" not in unit.modules else unit


def plan_differences(plan: Plan, theirs: Plan, who: str = "accelerate") -> list[str]:
    """What ``who``'s plan from the exported config (``theirs``) does not do that ``plan`` does, in words."""
    out = []
    mine = {u.modules: _resolved(u) for u in plan.units}
    other = {u.modules: _resolved(u) for u in theirs.units}
    for modules in mine.keys() - other.keys():
        out.append(f"a fully_shard call on {mine[modules].name} ({who} makes no such call)")
    for modules in other.keys() - mine.keys():
        out.append(f"no call on {other[modules].name} ({who} makes one)")
    for modules in mine.keys() & other.keys():
        if mine[modules] != other[modules]:
            out.append(f"{mine[modules].name}: {mine[modules].options() or 'defaults'} ({who}: {other[modules].options()})")
    if plan.ignored:
        out.append(f"{len(plan.ignored)} parameters kept out of FSDP (ignored_params, e.g. LoRA kept whole with its "
                   "own gradient averaging): the YAML has no key for parameters")
    if set(plan.checkpoint) != set(theirs.checkpoint):
        out.append("activation checkpointing on modules other than every layer: fsdp_activation_checkpointing wraps "
                   "each layer the wrap policy matches")
    if plan.prefetch:
        out.append(f"explicit prefetch (set_modules_to_forward/backward_prefetch): {who} sets none")
    return out


def to_accelerate(model: nn.Module, plan: Plan, world_size: int = 8) -> tuple[str, list[str]]:
    """(YAML, what it cannot express): the accelerate config closest to ``plan``, checked by running the
    installed accelerate on it (``from_accelerate``) and comparing the calls; an empty list: the YAML
    gives exactly ``plan``."""
    import yaml

    from ..model.tree import as_tree

    config = accelerate_config(as_tree(model), plan)
    config["num_processes"] = world_size
    theirs = from_accelerate(model, config, world_size=world_size)
    cannot = plan_differences(plan, theirs)
    head = [f"# accelerate config for the plan {plan.name or '(unnamed)'}; checked with {theirs.origin.release}: "
            + ("it makes exactly these fully_shard calls." if not cannot else "it cannot express:")]
    head += [f"#  - {line}" for line in cannot]
    return "\n".join(head) + "\n" + yaml.safe_dump(config, sort_keys=False), cannot
