"""The ``shardviz`` command line.

    shardviz export MODEL (--layout sharded|ignored|separate [--checkpoint blocks] | --plan PLAN.json)
                    --world-size N [--replicate R] [--torch X.Y] [--param-dtype D] [--reduce-dtype D]
                    [-o apply_fsdp.py] [--force]
    shardviz plan write MODEL --layout L [--checkpoint blocks] -o plan.json [--force]
    shardviz plan read PLAN.json [--model MODEL --world-size N [--replicate R] [--torch X.Y]]
    shardviz plan search MODEL --world-size N (--device H100 | --device-memory 80GiB)
                    [--batch-size B --seq-len S] [--global-batch G] [--top K] -o plan.json [--force]
    shardviz report MODEL --layout L --world-size N [--replicate R] [--device-memory 80GiB]
                    [--optimizer adamw] [--param-dtype D] [--reduce-dtype D]
                    [--batch-size B --seq-len S] [--checkpoint blocks] -o report.html

MODEL is ``zoo:NAME`` (a model of ``shardviz.zoo``), a Hugging Face ``config.json`` (the file or
its folder; ``--adapter`` adds a peft ``adapter_config.json``, ``--dtype`` overrides the base
dtype; built on meta by ``sv.load_model``, no download), or ``package.module:factory`` (a callable
that takes no argument and returns an ``nn.Module``; the current directory is importable).

Each command walks the model once (one ``ModelTree``) and passes that tree to every step.

Files are written atomically (a temporary file in the same folder, then renamed) and never
overwritten without ``--force``. Bad input exits 2 with one line on stderr, ``shardviz: error: ...``;
a plan torch would refuse exits 1, its findings one per line.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from dataclasses import replace
from pathlib import Path

EXIT_OK, EXIT_REFUSED, EXIT_USAGE = 0, 1, 2


class CliError(Exception):
    """Bad input: printed as one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage dump
        raise CliError(f"{self.prog}: {message} (see --help)")


# ---------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------
def is_config_path(spec: str) -> bool:
    """A ``config.json`` (or the folder holding one) rather than ``zoo:NAME`` / ``package.module:factory``."""
    return spec.endswith(".json") or Path(spec).is_dir() or (os.sep in spec and ":" not in spec)


def model_from_spec(spec: str, lora: bool = True, adapter=None, dtype=None):
    """``zoo:NAME``, a ``config.json`` (+ ``adapter`` paths) or ``package.module:factory`` -> an nn.Module."""
    if adapter and not is_config_path(spec):
        raise CliError(f"--adapter applies to a config.json model, not {spec!r}")
    if dtype and not is_config_path(spec):
        raise CliError(f"--dtype applies to a config.json model, not {spec!r}")
    if spec.startswith("zoo:"):
        from . import zoo

        try:
            return zoo.build(spec, lora=lora)
        except ValueError as exc:
            raise CliError(str(exc)) from None
    if is_config_path(spec):
        from .load import load_model

        try:
            return load_model(spec, adapter=adapter or None, dtype=dtype)
        except (ValueError, ImportError) as exc:
            raise CliError(str(exc)) from None
    return _model_from_factory(spec)


def _model_from_factory(spec: str):
    """``package.module:factory`` (or ``:attribute``, an nn.Module) -> an nn.Module; the current folder is importable."""
    from torch import nn

    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise CliError(f"model {spec!r}: expected zoo:NAME, path/to/config.json or package.module:factory")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any import failure is the user's input
        raise CliError(f"model {spec!r}: cannot import {module_name!r}: {type(exc).__name__}: {exc}") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise CliError(f"model {spec!r}: {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if isinstance(obj, nn.Module):
        return obj
    if not callable(obj):
        raise CliError(f"model {spec!r}: {attr!r} is neither an nn.Module nor a callable")
    try:
        model = obj()
    except Exception as exc:  # noqa: BLE001
        raise CliError(f"model {spec!r}: {attr}() raised {type(exc).__name__}: {exc}") from None
    if not isinstance(model, nn.Module):
        raise CliError(f"model {spec!r}: {attr}() returned {type(model).__name__}, not an nn.Module")
    return model


def make_mesh(world: int | None, replicate: int, tensor: int = 1):
    from .fsdp import Mesh

    if world is None:
        raise CliError("--world-size is required")
    if world < 1 or replicate < 1 or tensor < 1:
        raise CliError(f"--world-size {world}, --replicate {replicate} and --tensor-parallel {tensor} must be positive")
    if world % (replicate * tensor):
        raise CliError(f"--world-size {world} is not a multiple of --replicate {replicate} x --tensor-parallel {tensor}")
    return Mesh(shard=world // (replicate * tensor), replicate=replicate, tensor=tensor)


def check_version(version: str | None) -> str | None:
    if version is None:
        return None
    from .fsdp import MIN_TORCH, parse_version

    try:
        release = parse_version(version)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if release < MIN_TORCH:
        raise CliError(f"--torch {version}: fully_shard (FSDP2) needs torch >= 2.4")
    return version


def read_plan(path: str):
    from .plan import Plan

    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise CliError(f"cannot read plan {path!r}: {exc.strerror or exc}") from None
    try:
        return Plan.from_json(text)
    except ValueError as exc:
        raise CliError(f"plan {path!r}: {exc}") from None


def build_model(args):
    """The command's model, walked once: (model, tree). Every later step reads the tree."""
    from .tree import ModelTree

    model = model_from_spec(args.model, lora=not args.no_lora, adapter=getattr(args, "adapter", None),
                       dtype=getattr(args, "dtype", None))
    return model, ModelTree(model)


def tensor_degree(args) -> int:
    return getattr(args, "tensor_parallel", 1)


def build_plan(tree, args):
    from .plan import Plan
    from .presets import named_plan

    checkpoint = getattr(args, "checkpoint", None)
    if args.plan and args.layout:
        raise CliError("give either --layout or --plan, not both")
    if args.plan and checkpoint:
        raise CliError("--checkpoint goes with --layout; a plan file lists its own 'checkpoint' modules")
    if args.plan:
        plan = read_plan(args.plan)
    else:
        tensor_parallel = True if tensor_degree(args) > 1 else None  # the model's own TP plan
        try:
            plan = Plan.auto(tree, lora=args.layout or "sharded", checkpoint=checkpoint, tensor_parallel=tensor_parallel)
        except ValueError as exc:
            raise CliError(str(exc)) from None
    try:
        plan.validate(tree)
        if tensor_degree(args) > 1 and plan.tensor_parallel:  # names, styles, divisibility: before any command runs
            from .tp import local_tree

            local_tree(tree, plan.tensor_parallel, tensor_degree(args))
    except ValueError as exc:
        raise CliError(f"plan does not fit the model: {exc}") from None
    return named_plan(tree, plan)  # the name the widget and the export give the same plan


def make_training(args, base=None):
    """``sv.Training`` from --optimizer, --param-dtype, --reduce-dtype, --batch-size, --seq-len: the
    fields given change ``base`` (the report's: ``views.DEFAULT_TRAINING``); None when no field
    is given and there is no base (an export without a precision policy)."""
    from .cost import Training

    kwargs = {}
    for key in ("optimizer", "param_dtype", "reduce_dtype", "batch_size", "seq_len", "global_batch"):
        value = getattr(args, key, None)
        if value is not None:
            kwargs[key] = int(value) if key == "optimizer" and str(value).isdigit() else value
    if "seq_len" in kwargs and "batch_size" not in kwargs and "global_batch" not in kwargs:
        raise CliError("--seq-len needs --batch-size (the micro-batch each rank trains on)")
    if not kwargs:
        return base
    try:
        return replace(base, **kwargs) if base is not None else Training(**kwargs)
    except ValueError as exc:
        raise CliError(str(exc)) from None


# ---------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------
def write_atomic(path: str, text: str, force: bool) -> None:
    """Write ``text`` to ``path`` atomically; without ``force`` an existing file is left alone."""
    from .files import write_text_atomic

    target = Path(path)
    if target.is_dir():
        raise CliError(f"{path!r} is a directory")
    if target.exists() and not force:
        raise CliError(f"{path!r} exists; pass --force to overwrite it")
    folder = target.parent if str(target.parent) else Path(".")
    if not folder.is_dir():
        raise CliError(f"folder {str(folder)!r} does not exist")
    try:
        write_text_atomic(target, text, overwrite=force)
    except FileExistsError:
        raise CliError(f"{path!r} exists; pass --force to overwrite it") from None


def emit(text: str, output: str | None, force: bool) -> None:
    if output is None or output == "-":
        sys.stdout.write(text)
    else:
        write_atomic(output, text, force)


def _print_findings(findings, stream, severities=("error", "warning")) -> None:
    for f in findings:
        if f.severity in severities:
            print(f"shardviz: {f.severity} {f.code}: {f.message}", file=stream)


# ---------------------------------------------------------------------------
# Commands
# ---------------------------------------------------------------------------
def cmd_export(args) -> int:
    from .analysis import analyze
    from .checks import run_checks
    from .codegen import export_code
    from .finding import PlanError

    version = check_version(args.torch)
    mesh = make_mesh(args.world_size, args.replicate, tensor_degree(args))
    training = make_training(args)
    _, tree = build_model(args)
    plan = build_plan(tree, args)
    try:
        code = export_code(tree, plan, mesh=mesh, training=training, torch_version=version)
    except PlanError as exc:
        print(f"shardviz: error: torch would refuse this plan ({len(exc.findings)} finding(s)); nothing written",
              file=sys.stderr)
        _print_findings(exc.findings, sys.stderr, ("error",))
        return EXIT_REFUSED
    emit(code, args.output, args.force)
    if not args.quiet:
        analysis = analyze(tree, plan, mesh, training, strict=False, torch_version=version)
        _print_findings(run_checks(analysis, torch_version=version), sys.stderr)
        if args.output not in (None, "-"):
            print(f"shardviz: wrote {args.output}: {len(plan.units)} fully_shard calls, {len(plan.ignored)} ignored "
                  f"parameters, mesh {mesh}, torch {version or '>= 2.4 (detected at run time)'}", file=sys.stderr)
    return EXIT_OK


def cmd_plan_write(args) -> int:
    args.plan = None
    _, tree = build_model(args)
    plan = build_plan(tree, args)
    emit(plan.to_json() + "\n", args.output, args.force)
    if args.output not in (None, "-"):
        print(f"shardviz: wrote {args.output}: {len(plan.units)} units, {len(plan.ignored)} ignored parameters",
              file=sys.stderr)
    return EXIT_OK


def cmd_plan_read(args) -> int:
    from .analysis import analyze
    from .checks import run_checks
    from .presets import named_plan

    plan = read_plan(args.file)
    tree = version = mesh = None
    if args.model is not None:
        version = check_version(args.torch)
        mesh = make_mesh(args.world_size, args.replicate, tensor_degree(args))
        _, tree = build_model(args)
        try:
            plan.validate(tree)
        except ValueError as exc:
            raise CliError(f"plan does not fit the model: {exc}") from None
        plan = named_plan(tree, plan)  # the name the widget and the export give the same plan
    out = sys.stdout
    print(f"plan {plan.name or '(unnamed)'}: {len(plan.units)} fully_shard calls, {len(plan.ignored)} ignored parameters",
          file=out)
    for unit in plan.units:
        options = unit.options()
        print(f"  fully_shard {unit.name}" + (f"  {options}" if options else ""), file=out)
    if tree is None:
        return EXIT_OK
    analysis = analyze(tree, plan, mesh, strict=False, torch_version=version)
    print(analysis.summary(), file=out)
    findings = run_checks(analysis, torch_version=version)
    for f in findings:
        print(f"  {f}", file=out)
    return EXIT_REFUSED if any(f.severity == "error" for f in findings) else EXIT_OK


def cmd_plan_search(args) -> int:
    """Print the search's table (best first) and write the best plan; nothing fits: exit 1, nothing written."""
    from .search import search

    mesh = make_mesh(args.world_size, 1)
    mesh = _search_mesh(mesh, args.device, args.device_memory, args.memory_reserve)
    training = make_training(args)
    _, tree = build_model(args)
    try:
        s = search(tree, mesh=mesh, training=training)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    import pandas as pd

    with pd.option_context("display.max_colwidth", 120, "display.width", 250):
        print(s.formatted().head(args.top).to_string(), file=sys.stdout)
    print(f"shardviz: {s.n_candidates} plans, {s.n_analysed} analyses; {s.note}", file=sys.stderr)
    if s.best is None:
        print(f"shardviz: error: {s.table.why.iloc[0].split('. This row')[0]}; nothing written", file=sys.stderr)
        return EXIT_REFUSED
    emit(s.best.to_json() + "\n", args.output, args.force)
    t = s.best_training
    print(f"shardviz: best: {s.table.name.iloc[0]} (mesh {s.best_mesh}"
          + (f"; --replicate {s.best_mesh.replicate}" if s.best_mesh.is_hsdp else "")
          + (f"; micro-batch {t.batch_size} x {s.table.grad_accum.iloc[0]} accumulation" if t is not None else "")
          + ")" + (f"; wrote {args.output}" if args.output not in (None, "-") else ""), file=sys.stderr)
    print(f"shardviz: {s.explain()}", file=sys.stderr)
    return EXIT_OK


def _search_mesh(mesh, device, device_memory, memory_reserve=None):
    from dataclasses import fields

    if device is not None:
        if "device" not in {f.name for f in fields(mesh)}:
            raise CliError(f"--device {device}: this shardviz has no device table yet (sv.Mesh(device=...)); "
                           "give --device-memory instead")
        mesh = replace(mesh, device=device)
    mesh = _with_memory(mesh, device_memory, memory_reserve)
    if mesh.device_memory is None:
        raise CliError("plan search needs --device or --device-memory: what fits depends on it")
    return mesh


RESERVE_HELP = ("e.g. 2GiB: kept out of the device memory for the CUDA context and NCCL's buffers "
                "(default 1 GiB, 0 allowed; docs/step-time.md)")


def _with_memory(mesh, device_memory, memory_reserve):
    """``--device-memory`` and ``--memory-reserve`` on the mesh (bad sizes: the mesh's error)."""
    changes = {k: v for k, v in (("device_memory", device_memory), ("memory_reserve", memory_reserve)) if v is not None}
    try:
        return replace(mesh, **changes)
    except ValueError as exc:
        raise CliError(str(exc)) from None


def cmd_report(args) -> int:
    from .plan import LORA_LAYOUTS, Plan
    from .report import render_report
    from .views import DEFAULT_TRAINING, training_text

    version = check_version(args.torch)
    mesh = make_mesh(args.world_size, args.replicate, tensor_degree(args))
    mesh = _with_memory(mesh, args.device_memory or None, args.memory_reserve)
    training = make_training(args, base=DEFAULT_TRAINING)
    _, tree = build_model(args)
    plan = build_plan(tree, args)
    layouts = None
    if not args.no_compare and any(p.role == "lora" for p in tree.params):
        layouts = {f"LoRA {x}": Plan.auto(tree, lora=x, checkpoint=args.checkpoint) for x in LORA_LAYOUTS}
    text = render_report(tree, plan, mesh, training, torch_version=version, compare_with=layouts)
    emit(text, args.output, args.force)
    if args.output not in (None, "-"):
        print(f"shardviz: wrote {args.output} ({len(text) / 2**20:.1f} MiB, opens offline); training: "
              f"{training_text(training)}", file=sys.stderr)
    return EXIT_OK


MODEL_HELP = "zoo:NAME, path/to/config.json (or its folder), or package.module:factory"


def _add_model_args(p, model_required=True) -> None:
    if model_required:
        p.add_argument("model", help=MODEL_HELP)
    p.add_argument("--no-lora", action="store_true", help="zoo models: build without LoRA adapters")
    p.add_argument("--adapter", action="append", metavar="ADAPTER_CONFIG",
                   help="config.json models: a peft adapter_config.json (or its folder); repeat for several adapters")
    p.add_argument("--dtype", choices=DTYPE_CHOICES, help="config.json models: dtype of the base weights (default: the config's)")


def _add_checkpoint_arg(p) -> None:
    p.add_argument("--checkpoint", type=_checkpoint_preset, metavar="{blocks,'every K',selective}",
                   help="wrap every block (or every K-th: 'every 2') in torch's checkpoint_wrapper before fully_shard "
                        "(Plan.auto(checkpoint=...))")


def _checkpoint_preset(value: str) -> str:
    from .plan import checkpoint_preset

    try:
        checkpoint_preset(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def _add_precision_args(p) -> None:
    p.add_argument("--param-dtype", choices=DTYPE_CHOICES,
                   help="MixedPrecisionPolicy param_dtype for every call (report default: bfloat16)")
    p.add_argument("--reduce-dtype", choices=DTYPE_CHOICES,
                   help="MixedPrecisionPolicy reduce_dtype for every call (report default: float32)")


def _add_mesh_args(p, required=True) -> None:
    p.add_argument("--world-size", type=int, required=required, help="total ranks (replicate x shard)")
    p.add_argument("--replicate", type=int, default=1, help="HSDP replicas (default 1: plain FSDP)")
    p.add_argument("--tensor-parallel", type=int, default=1, metavar="T",
                   help="tensor-parallel ranks inside a node (default 1); a preset then takes the model's own TP plan")
    p.add_argument("--torch", metavar="X.Y", help="target torch release (default: detected when the code runs)")


DTYPE_CHOICES = ("float32", "bfloat16", "float16", "float64")


def _add_search_parser(plan_sub) -> None:
    q = plan_sub.add_parser("search", help="try the plans a user would consider; print them best first, write the best")
    _add_model_args(q)
    q.add_argument("--world-size", type=int, required=True, help="total ranks (the HSDP split is searched)")
    q.add_argument("--device", help="a device of the table, e.g. H100 (its memory is the limit)")
    q.add_argument("--device-memory", help="e.g. 80GiB: the limit a plan must fit in")
    q.add_argument("--memory-reserve", help=RESERVE_HELP)
    q.add_argument("--optimizer", help="adamw (default), adam, sgd, sgd_momentum, or a number of states per parameter")
    _add_precision_args(q)
    q.add_argument("--batch-size", type=int, help="micro-batch per rank: the peak then includes activations")
    q.add_argument("--seq-len", type=int, help="tokens per sequence (with --batch-size; default 2048)")
    q.add_argument("--global-batch", type=int, help="sequences per optimizer step over all ranks: searches micro-batch x accumulation")
    q.add_argument("--top", type=int, default=20, help="rows of the table to print (default 20)")
    q.add_argument("-o", "--output", help="output file for the best plan (default: stdout)")
    q.add_argument("--force", action="store_true", help="overwrite an existing output file")
    q.set_defaults(func=cmd_plan_search)


def build_parser() -> argparse.ArgumentParser:
    from .plan import LORA_LAYOUTS

    parser = _Parser(prog="shardviz", description="Plan, check and export PyTorch FSDP2 fully_shard layouts.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("export", help="write the fully_shard code for a plan")
    _add_model_args(p)
    p.add_argument("--layout", choices=LORA_LAYOUTS, help="per-block preset (sv.Plan.auto); default sharded")
    p.add_argument("--plan", help="a plan JSON file instead of a preset")
    _add_checkpoint_arg(p)
    _add_mesh_args(p)
    _add_precision_args(p)
    p.add_argument("-o", "--output", help="output file (default: stdout)")
    p.add_argument("--force", action="store_true", help="overwrite an existing output file")
    p.add_argument("-q", "--quiet", action="store_true", help="no findings or summary on stderr")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("plan", help="write or read plan JSON files")
    plan_sub = p.add_subparsers(dest="plan_command", required=True, parser_class=_Parser)
    w = plan_sub.add_parser("write", help="write the per-block preset for a model as JSON")
    _add_model_args(w)
    w.add_argument("--layout", choices=LORA_LAYOUTS, default="sharded")
    _add_checkpoint_arg(w)
    w.add_argument("-o", "--output", help="output file (default: stdout)")
    w.add_argument("--force", action="store_true", help="overwrite an existing output file")
    w.set_defaults(func=cmd_plan_write)
    _add_search_parser(plan_sub)
    r = plan_sub.add_parser("read", help="validate a plan JSON file; with --model, analyse it")
    r.add_argument("file")
    _add_model_args(r, model_required=False)
    r.add_argument("--model", help=MODEL_HELP)
    _add_mesh_args(r, required=False)
    r.set_defaults(func=cmd_plan_read)

    p = sub.add_parser("report", help="write a standalone HTML report (tables, charts, findings, code)")
    _add_model_args(p)
    p.add_argument("--layout", choices=LORA_LAYOUTS, help="per-block preset (sv.Plan.auto); default sharded")
    p.add_argument("--plan", help="a plan JSON file instead of a preset")
    _add_mesh_args(p)
    _add_checkpoint_arg(p)
    p.add_argument("--device-memory", help="e.g. 80GiB: draw the limit and flag a peak that does not fit")
    p.add_argument("--memory-reserve", help=RESERVE_HELP)
    p.add_argument("--optimizer", help="adamw (default), adam, sgd, sgd_momentum, or a number of states per parameter")
    _add_precision_args(p)
    p.add_argument("--batch-size", type=int, help="micro-batch per rank: the peak then includes activations")
    p.add_argument("--seq-len", type=int, help="tokens per sequence (with --batch-size; default 2048)")
    p.add_argument("--no-compare", action="store_true", help="leave out the LoRA layouts compared side by side")
    p.add_argument("-o", "--output", help="output file (default: stdout)")
    p.add_argument("--force", action="store_true", help="overwrite an existing output file")
    p.set_defaults(func=cmd_report)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if getattr(args, "func", None) is cmd_plan_read and args.model is not None and args.world_size is None:
            raise CliError("plan read --model needs --world-size")
        return args.func(args)
    except CliError as exc:
        print(f"shardviz: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
