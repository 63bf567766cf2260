"""The ``shardviz`` command line.

    shardviz --version
    shardviz export MODEL (--lora sharded|ignored|separate [--checkpoint blocks] | --plan PLAN.json)
                    --world-size N [--replicate R] [--torch X.Y] [--param-dtype D] [--reduce-dtype D]
                    [-o apply_fsdp.py] [--force]
    shardviz plan write MODEL --lora LORA [--checkpoint blocks] -o plan.json [--force]
    shardviz plan read PLAN.json [--model MODEL --world-size N [--replicate R] [--torch X.Y]]
    shardviz plan search MODEL --world-size N (--device H100 | --device-memory 80GiB)
                    [--batch-size B --seq-len S] [--global-batch G] [--top K] -o plan.json [--force]
    shardviz report MODEL (--lora LORA | --plan PLAN.json) --world-size N [--replicate R]
                    [--device H100 | --device-memory 80GiB] [--optimizer adamw] [--param-dtype D]
                    [--reduce-dtype D] [--batch-size B --seq-len S [--grad-accum K]] [--checkpoint blocks]
                    -o report.html

MODEL is ``zoo:NAME`` (a model of ``shardviz.zoo``), a Hugging Face ``config.json`` (the file or
its folder; ``--adapter`` adds a peft ``adapter_config.json``, ``--dtype`` overrides the base
dtype; built on meta by ``sv.load_model``, no download), or ``package.module:factory`` (a callable
that takes no argument and returns an ``nn.Module``; the current directory is importable).

Each command walks the model once (one ``ModelTree``) and passes that tree to every step.

One training default everywhere: ``DEFAULT_TRAINING == sv.Training()`` (AdamW, bf16 parameters, fp32 reduction),
as ``sv.analyze``, the Inspector, ``sv.search`` and the report assume; ``--param-dtype none`` keeps the model's
dtypes (no ``MixedPrecisionPolicy``). Every command says the training and mesh it assumed.
A plan file written by ``plan search`` records the mesh (HSDP split, device) and the training:
``export --plan`` and ``report --plan`` read them, and a flag given explicitly overrides the file
(the output says so). Sizes: ``80GiB``, ``96GB``; a bare number is GiB (``--device-memory 40``).
Device names: the table's, or a vendor's spelling (``H100-80GB``, ``A100 40GB``, ``MI300X``).

Files are written atomically (a temporary file in the same folder, then renamed) and never
overwritten without ``--force``. Bad input exits 2 with one line on stderr, ``shardviz: error: ...``
(a refusal of any shardviz function, never a traceback); a plan torch would refuse exits 1, its
findings one per line. Answers go to stdout, context and progress to stderr (``terminal``).
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pandas as pd

from ..analysis import analyze
from ..checkpointing import parse_checkpoint
from ..checks import run_checks
from .cli_args import (  # noqa: F401 - the command line's inputs, importable from here as before
    CliError,
    build_model,
    build_plan,
    check_plan_file,
    check_version,
    is_config_path,
    make_mesh,
    make_training,
    model_from_spec,
    model_label,
    read_plan,
    resolve_setup,
)
from ..export.codegen import export_code
from ..run.setup import setup_obj
from ..run.devices import device_by_name
from ..views.display import versions_text
from ..files import write_text_atomic
from ..finding import PlanError
from ..format import format_bytes, format_duration, format_percent, format_rate, parse_size
from ..frameworks import to_accelerate
from ..frameworks.axolotl_config import to_axolotl
from ..frameworks.torchtune_config import to_torchtune
from ..frameworks.trainer_config import to_trainer
from ..plan import LORA_OPTIONS
from ..presets import auto_plan, named_plan
from ..report import render_report
from ..search import search
from .terminal import WIDTH, answer, finding_lines, quiet_libraries, report_lines, say, seq_len_warning, table_text

EXIT_OK, EXIT_REFUSED, EXIT_USAGE = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage dump
        raise CliError(f"{self.prog}: {message} (see --help)")


# ---------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------
def write_atomic(path: str, text: str, force: bool) -> None:
    """Write ``text`` to ``path`` atomically; without ``force`` an existing file is left alone."""
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


def _print_findings(findings, severities=("error", "warning")) -> None:
    for f in findings:
        if f.severity in severities:
            fix = f.fix_for("cli")
            say(f"{f.severity} {f.code}: {f.message}" + (f" Fix: {fix}" if fix else ""))


# ---------------------------------------------------------------------------
# Commands
# ---------------------------------------------------------------------------
class Refused(Exception):
    """A plan that would not run (its findings are printed): exit code 1, no verdict, nothing written."""


def _build_plan(tree, args, model=None):
    """``cli_args.build_plan``; a captured function that raised (``--plan-from``: SV301) would stop the
    run at start-up: its error on stderr, then ``Refused`` (no verdict, nothing written)."""
    plan = build_plan(tree, args, model)
    raised = [f for f in (plan.origin.findings if plan.origin else ()) if f.code == "SV301"]
    if raised:
        _print_findings([replace(f, message=f.message.replace(" The plan below is what it had done until then.", ""))
                         for f in raised], ("error",))
        say(f"error: {plan.origin.source} raised: the run would stop at start-up, so there is no plan to price; "
            "nothing written")
        raise Refused()
    return plan


def _add_source_args(p) -> None:
    p.add_argument("--accelerate-config", metavar="FSDP.YAML", help="the plan accelerate's own FSDP2 preparation makes "
                   "from this config (sv.Plan.from_accelerate; needs shardviz[accelerate])")
    p.add_argument("--trainer-config", metavar="ARGS.YAML", help="the plan, batch, sequence, accumulation and precision "
                   "of a Hugging Face Trainer / TRL run: a YAML or JSON of its TrainingArguments / SFTConfig fields, "
                   "read by transformers and prepared by accelerate (sv.from_trainer)")
    p.add_argument("--torchtune-config", nargs="+", metavar="RECIPE.YAML [KEY=VALUE ...]", help="the model, plan, "
                   "batch, sequence, accumulation and dtype of a torchtune distributed recipe, with tune run's "
                   "key=value overrides, read by torchtune's own code (sv.from_torchtune; MODEL then comes from "
                   "the recipe's model._component_); RECIPE.YAML may be a config torchtune ships, as tune run "
                   "takes it: llama3_1/70B_lora")
    p.add_argument("--axolotl-config", metavar="AXOLOTL.YAML", help="the model (base_model, a local config), adapter, "
                   "plan, batch, sequence, accumulation and checkpointing of an axolotl run, read by axolotl's validated "
                   "config and prepared by its own fsdp2_prepare_model (sv.from_axolotl; MODEL, given, wins)")
    p.add_argument("--plan-from", metavar="MODULE:FUNCTION", help="the plan your own function makes, e.g. "
                   "my_train:apply_fsdp, called as function(model) or function(model, mesh) (sv.capture)")


def cmd_export(args) -> int:
    version = check_version(args.torch)
    model, tree = build_model(args)
    plan = _build_plan(tree, args, model)
    mesh, training, notes = resolve_setup(args, plan)
    try:
        code = export_code(tree, plan, mesh=mesh, training=training, torch_version=version)
    except PlanError as exc:
        say(f"error: torch would refuse this plan ({len(exc.findings)} finding(s)); nothing written")
        _print_findings(exc.findings, ("error",))
        return EXIT_REFUSED
    emit(code, args.output, args.force)
    _export_framework_configs(args, model, plan, mesh.world)
    if not args.quiet:
        analysis = analyze(tree, plan, mesh, training, strict=False, torch_version=version)
        _print_findings(run_checks(analysis, torch_version=version))
        for note in [*notes, seq_len_warning(tree, training)]:
            if note:
                say(note)
        if args.output not in (None, "-"):
            say(f"wrote {args.output}: {len(plan.units)} fully_shard calls, {len(plan.ignored)} ignored "
                f"parameters, mesh {mesh}, torch {version or '>= 2.4 (detected at run time)'}")
    return EXIT_OK


def _export_framework_configs(args, model, plan, world: int) -> None:
    """--accelerate-yaml / --trainer-yaml / --axolotl-yaml / --torchtune-overrides: the same plan in the keys of
    that framework, each checked by its own code, with what the keys cannot say."""
    wanted = [(args.accelerate_yaml, "accelerate", lambda: to_accelerate(model, plan, world)),
              (args.trainer_yaml, "transformers' Trainer", lambda: to_trainer(model, plan, world)),
              (args.axolotl_yaml, "axolotl", lambda: to_axolotl(_framework_file(args, "axolotl_config", "--axolotl-yaml"), plan, model, world)),
              (args.torchtune_overrides, "torchtune", lambda: _torchtune_text(args, plan, world))]
    for path, who, export in wanted:
        if not path:
            continue
        try:
            text, cannot = export()
        except (ValueError, ImportError) as exc:
            raise CliError(str(exc)) from None
        write_atomic(path, text, args.force)
        say(f"wrote {path}" + (f"; it cannot express: {'; '.join(cannot)}" if cannot else
                               f": {who} makes exactly these calls from it"))


def _framework_file(args, flag: str, export: str):
    if not getattr(args, flag):
        raise CliError(f"{export} says the plan in your own file: give it with --{flag.replace('_', '-')}")
    return getattr(args, flag)


def _torchtune_text(args, plan, world: int):
    path, *overrides = _framework_file(args, "torchtune_config", "--torchtune-overrides")
    keys, cannot = to_torchtune(path, plan, overrides, world_size=world)
    head = [f"# tune run overrides for the plan {plan.name or '(unnamed)'} on {path}"]
    return "\n".join(head + [f"#  cannot say: {c}" for c in cannot] + keys) + "\n", cannot


def cmd_plan_write(args) -> int:
    _, tree = build_model(args)
    plan = build_plan(tree, args)
    emit(plan.to_json() + "\n", args.output, args.force)
    if args.output not in (None, "-"):
        print(f"shardviz: wrote {args.output}: {len(plan.units)} units, {len(plan.ignored)} ignored parameters",
              file=sys.stderr)
    return EXIT_OK


def _plan_lines(plan) -> list[str]:
    lines = [f"plan {plan.name or '(unnamed)'}: {len(plan.units)} fully_shard calls, {len(plan.ignored)} ignored parameters"]
    return lines + [f"  fully_shard {u.name}" + (f"  {u.options()}" if u.options() else "") for u in plan.units]


def cmd_plan_read(args) -> int:
    plan = read_plan(args.file)
    if args.model is None:
        answer("\n".join(_plan_lines(plan)))
        return EXIT_OK
    version = check_version(args.torch)
    _, tree = build_model(args)
    gap = check_plan_file(tree, plan, args.file, gaps=False)  # the blocks it misses: an error line below
    try:
        plan.validate(tree)
    except ValueError as exc:
        raise CliError(f"plan does not fit the model: {exc}") from None
    plan = named_plan(tree, plan).with_setup(plan.setup)  # the name the widget and the export give the same plan
    lines = _plan_lines(plan)
    args.plan = args.file
    mesh, training, notes = resolve_setup(args, plan)
    analysis = analyze(tree, plan, mesh, training, strict=False, torch_version=version)
    findings = run_checks(analysis, torch_version=version)
    gap_lines = textwrap.wrap(gap, WIDTH, subsequent_indent="    ", break_on_hyphens=False) if gap else []
    answer("\n".join([*lines, analysis.summary(), *notes, *gap_lines, *finding_lines(findings, top=len(findings))]))
    return EXIT_REFUSED if gap or any(f.severity == "error" for f in findings) else EXIT_OK


def cmd_plan_search(args) -> int:
    """Print the search's table (best first) and write the best plan with its mesh and training;
    nothing fits: exit 1, nothing written."""
    if args.device is None and args.device_memory is None:
        raise CliError("plan search needs --device or --device-memory: what fits depends on it")
    mesh, training, notes = resolve_setup(args)
    _, tree = build_model(args)
    try:
        s = search(tree, mesh=mesh, training=training, workers=2)  # on two cores where it can fork (Linux)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    answer(search_table(s, args.top))
    for note in [*notes, seq_len_warning(tree, training)]:
        if note:
            say(note)
    say(f"{s.n_candidates} plans, {s.n_analysed} analyses" + (f"; {s.note}" if s.note else ""))
    if s.best is None:
        say(f"error: {s.table.why.iloc[0].split('. This row')[0]}; nothing written")
        return EXIT_REFUSED
    t = s.best_training or training
    emit(s.best.to_json(setup=setup_obj(s.best_mesh, t)) + "\n", args.output, args.force)
    say(f"best: {s.table.name.iloc[0]} (mesh {s.best_mesh}"
        + (f"; --replicate {s.best_mesh.replicate}" if s.best_mesh.is_hsdp else "")
        + (f"; micro-batch {t.batch_size} x {s.table.grad_accum.iloc[0]} accumulation" if s.best_training else "")
        + ")" + (f"; wrote {args.output} (with its mesh and training: export/report --plan "
                 f"{args.output} need no other flag)" if args.output not in (None, "-") else ""))
    say(s.explain())
    return EXIT_OK


#: Words of the search's plan names shortened in the terminal table (the full names: s.table.name).
SHORT_NAMES = (("no checkpointing", "no ckpt"), ("checkpoint every block", "ckpt blocks"),
               ("checkpoint every", "ckpt every"), ("no reshard after forward", "no reshard"),
               ("selective checkpointing", "selective ckpt"), ("CPU offload", "offload"))


def _short_name(name: str) -> str:
    for long, short in SHORT_NAMES:
        name = name.replace(long, short)
    return name


def search_table(s, top: int) -> str:
    """The search's table, best first, in ``terminal.WIDTH`` columns: plan, peak, what is to spare
    (or over), step time, tokens/s and MFU (the reasons: ``Search.explain`` and ``s.table.why``)."""
    t = s.table.head(top)
    num = lambda v: v is not None and v == v  # noqa: E731 - not None, not NaN
    spare = [("" if not num(m) else format_bytes(m) if m >= 0 else f"over {format_bytes(-m)}") for m in t.margin]
    table = pd.DataFrame({
        "#": range(1, len(t) + 1), "plan": t.name.map(_short_name),
        # the peak the verdict judges, so peak + spare = usable (a pruned row: a lower bound on its allocated peak)
        "peak": [(format_bytes(j) if a else ">= " + format_bytes(p)) if num(j if a else p) else ""
                 for p, j, a in zip(t.peak, t.judged_peak, t.analysed)],
        "spare": spare, "step": t.step_time_s.map(lambda v: format_duration(v) if num(v) else ""),
        "tokens/s": t.tokens_per_s.map(lambda v: format_rate(v) if num(v) else ""),
        "MFU": t.mfu.map(lambda v: format_percent(v) if num(v) else "")})
    # names wrap (never cut); a row without numbers says why under its name (pruned: the rule that settled it)
    notes = ["" if a else f"not analysed: {w.removesuffix(' (not analysed)')}" for a, w in zip(t.analysed, t.why)]
    return table_text(table, shrink="plan", wrap=True, notes=notes)


RESERVE_HELP = ("e.g. 2GiB: kept out of the device memory for the CUDA context and NCCL's buffers "
                "(default 1 GiB, 0 allowed; docs/step-time.md)")


MARGIN_HELP = ("kept free below the usable memory, a fraction (0.05), a percentage (5%%) or a size (4GiB): "
               "a plan inside it is 'tight', not 'fits' (default 5%%; docs/cost-model.md)")


def _add_allocator_args(p) -> None:
    """The fits verdict's assumptions: the safety margin, the allocator setting, the peak judged."""
    p.add_argument("--safety-margin", help=MARGIN_HELP)
    p.add_argument("--expandable-segments", action="store_true",
                   help="the run sets PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (the reserved peak is modelled for it)")
    p.add_argument("--judge", choices=("reserved", "allocated"),
                   help="the peak the verdict judges: the caching allocator's reserved peak (default) or the allocated one")


def cmd_report(args) -> int:
    version = check_version(args.torch)
    model, tree = build_model(args)
    plan = _build_plan(tree, args, model)
    mesh, training, notes = resolve_setup(args, plan)
    lora_plans = None
    if not args.no_compare and not args.torchtune_config and not args.axolotl_config and any(p.role == "lora" for p in tree.params):
        checkpoint = args.checkpoint
        lora_plans = {f"LoRA {x}": auto_plan(tree, lora=x, checkpoint=checkpoint) for x in LORA_OPTIONS}
    a = analyze(tree, plan, mesh, training, strict=False, torch_version=version)
    label = model_label(args.model) if args.model else plan.origin.label
    text = render_report(tree, plan, mesh, training, torch_version=version, compare_with=lora_plans, analysis=a,
                         model_label=label)
    emit(text, args.output, args.force)
    to_file = args.output not in (None, "-")
    lines = report_lines(a, a.findings, notes, label)  # the findings the report shows (run_checks, computed once)
    answer("\n".join(lines), None if to_file else sys.stderr)  # stdout holds the HTML without -o
    if to_file:
        say(f"wrote {args.output} ({len(text) / 2**20:.1f} MiB, opens offline)")
    return EXIT_OK


MODEL_HELP = "zoo:NAME, path/to/config.json (or its folder), or package.module:factory"


def _add_model_args(p, model_required=True, model_optional=False) -> None:
    if model_required:
        p.add_argument("model", help=MODEL_HELP, **({"nargs": "?"} if model_optional else {}))
    p.add_argument("--no-lora", action="store_true", help="zoo models: build without LoRA adapters")
    p.add_argument("--adapter", action="append", metavar="ADAPTER_CONFIG",
                   help="config.json models: a peft adapter_config.json (or its folder); repeat for several adapters")
    p.add_argument("--dtype", choices=DTYPE_CHOICES, help="config.json models: dtype of the base weights (default: the config's)")
    p.add_argument("--attn-implementation", choices=ATTN_CHOICES,
                   help="config.json models: the attention measured (transformers' attn_implementation; default: "
                        "transformers' pick for the class, sdpa where supported, else eager)")
    p.add_argument("--load-in-4bit", action="store_true",
                   help="config.json models: load as bitsandbytes 4-bit (QLoRA: BitsAndBytesConfig(load_in_4bit=True)), "
                        "built on meta, priced to the byte (needs pip install 'shardviz[qlora]')")
    p.add_argument("--load-in-8bit", action="store_true",
                   help="config.json models: load as bitsandbytes 8-bit (LLM.int8: BitsAndBytesConfig(load_in_8bit=True)), "
                        "built on meta, priced to the byte (needs pip install 'shardviz[qlora]')")
    p.add_argument("--quant-storage", choices=("bfloat16", "float16", "float32", "uint8"),
                   help="4-bit models: bnb_4bit_quant_storage, the dtype FSDP2 shards the packed weights in (default: "
                        "the config's; uint8 with --load-in-4bit, as bitsandbytes)")
    p.add_argument("--quant-type", choices=("nf4", "fp4"), help="4-bit models: bnb_4bit_quant_type (default: nf4)")
    p.add_argument("--double-quant", action="store_true", help="4-bit models: bnb_4bit_use_double_quant")


def _add_checkpoint_arg(p) -> None:
    p.add_argument("--checkpoint", type=_checkpoint_preset, metavar="{blocks,'every K',selective}",
                   help="wrap every block (or every K-th: 'every 2') in torch's checkpoint_wrapper before fully_shard "
                        "(Plan.auto(checkpoint=...))")


def _checkpoint_preset(value: str) -> str:
    try:
        parse_checkpoint(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


ATTN_CHOICES = ("eager", "sdpa", "flex_attention", "flash_attention_2", "flash_attention_3")


def _add_precision_args(p) -> None:
    p.add_argument("--use-cache", action=argparse.BooleanOptionalAction, default=None,
                   help="the step keeps the key/value cache or not (Training(use_cache=...)); default: the config's, "
                        "off with checkpointing, as Hugging Face's gradient checkpointing does")
    p.add_argument("--param-dtype", choices=DTYPE_CHOICES + ("none",),
                   help="MixedPrecisionPolicy param_dtype for every call (default: bfloat16, shardviz's one default; "
                        "none: the model's dtypes, no policy)")
    p.add_argument("--reduce-dtype", choices=DTYPE_CHOICES + ("none",),
                   help="MixedPrecisionPolicy reduce_dtype for every call (default: float32)")


def _add_training_args(p, search: bool = False) -> None:
    p.add_argument("--optimizer", help="adamw (default), adam, sgd, sgd_momentum, or a number of states per parameter")
    _add_precision_args(p)
    p.add_argument("--offload", action="store_true", default=None, help="CPUOffloadPolicy for every call")
    p.add_argument("--batch-size", type=int, help="micro-batch per rank: the peak then includes activations")
    p.add_argument("--seq-len", type=int, help="tokens per sequence (with --batch-size; default 2048)")
    if not search:
        p.add_argument("--grad-accum", type=int, metavar="K",
                       help="micro-batches per optimizer step (Training(grad_accum=K)): gradients reduce-scatter on "
                            "the last one only, as the exported train_step does (default 1)")
    if search:
        p.add_argument("--global-batch", type=int,
                       help="sequences per optimizer step over all ranks: searches micro-batch x accumulation")


def _size(flag: str):
    def parse(value: str) -> int:
        try:
            parse_size(value, flag)  # refused here, naming the flag; kept as typed so the output can say how it was read
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return value
    return parse


def _device_name(value: str) -> str:
    try:
        device_by_name(value)  # refused here; kept as typed so the output can say how an alias was read
        return value
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_device_args(p, what: str) -> None:
    p.add_argument("--device", type=_device_name,
                   help="a device of the table (H100, H100-80GB, 'A100 40GB', MI300X, ...): its memory, links and "
                        "FLOPS give the fits verdict and the step time")
    p.add_argument("--device-memory", type=_size("--device-memory"),
                   help=f"e.g. 80GiB, 96GB or 80 (GiB): {what}")
    p.add_argument("--memory-reserve", type=_size("--memory-reserve"), help=RESERVE_HELP)
    p.add_argument("--host-memory", type=_size("--host-memory"),
                   help="e.g. 512GiB: the host RAM of one node, shared by its ranks; judged when anything is "
                        "offloaded (--offload); default: the device's system where the table says (DGX A100/H100)")


def _add_mesh_args(p, required=True) -> None:
    p.add_argument("--world-size", type=int, required=required,
                   help="total ranks (replicate x shard; default: the --plan file's mesh)")
    p.add_argument("--replicate", type=int, help="HSDP replicas (default 1: plain FSDP, or the --plan file's)")
    p.add_argument("--tensor-parallel", type=int, metavar="T",
                   help="tensor-parallel ranks inside a node (default 1, or the --plan file's); a preset then takes "
                        "the model's own TP plan")
    p.add_argument("--torch", metavar="X.Y", help="target torch release (default: detected when the code runs)")


DTYPE_CHOICES = ("float32", "bfloat16", "float16", "float64")


def _add_search_parser(plan_sub) -> None:
    q = plan_sub.add_parser("search", help="try the plans a user would consider; print them best first, write the best")
    _add_model_args(q)
    q.add_argument("--world-size", type=int, required=True, help="total ranks (the HSDP split is searched)")
    _add_device_args(q, "the limit a plan must fit in")
    _add_training_args(q, search=True)
    _add_allocator_args(q)
    q.add_argument("--top", type=int, default=20, help="rows of the table to print (default 20)")
    q.add_argument("-o", "--output", help="output file for the best plan, with its mesh and training (default: stdout)")
    q.add_argument("--force", action="store_true", help="overwrite an existing output file")
    q.set_defaults(func=cmd_plan_search)


def _add_plan_choice(p) -> None:
    p.add_argument("--lora", choices=LORA_OPTIONS, help="the per-block preset (sv.Plan.auto(lora=...)): LoRA parameters in "
                   "their block's call, ignored, or a call each; default sharded")
    p.add_argument("--plan", help="a plan JSON file instead of a preset (its mesh and training too, if it has them)")
    _add_checkpoint_arg(p)


def _add_output_args(p, what: str = "output file") -> None:
    p.add_argument("-o", "--output", help=f"{what} (default: stdout)")
    p.add_argument("--force", action="store_true", help="overwrite an existing output file")


#: The flags cli_args' shared readers (build_plan, resolve_setup, training_flags, ...) read whatever the
#: command, with the defaults their ``_add_*_args`` give them: a command without a flag reads it as not
#: given, and the readers read plain attributes. ``func`` is None when no command is given.
SHARED_DEFAULTS = {
    "lora": None, "plan": None, "checkpoint": None, "accelerate_config": None, "plan_from": None,
    "trainer_config": None, "trainer_setup": None,  # trainer_setup: what --trainer-config read (captured_plan)
    "torchtune_config": None, "framework_setup": None,  # framework_setup: what --torchtune-config / --axolotl-config read (build_model)
    "axolotl_config": None,
    "world_size": None, "replicate": None, "tensor_parallel": None,
    "device": None, "device_memory": None, "memory_reserve": None, "host_memory": None,
    "optimizer": None, "param_dtype": None, "reduce_dtype": None, "offload": None, "batch_size": None,
    "seq_len": None, "global_batch": None, "grad_accum": None, "use_cache": None,
    "safety_margin": None, "judge": None, "expandable_segments": False,
    "func": None,
}


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="shardviz", description="Plan, check and export PyTorch FSDP2 fully_shard plans.")
    parser.add_argument("--version", action="store_true", help="shardviz's version and the libraries it measures with")
    parser.set_defaults(**SHARED_DEFAULTS)  # a command's own flags and defaults override these
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)

    p = sub.add_parser("export", help="write the fully_shard code for a plan")
    _add_model_args(p, model_optional=True)
    _add_plan_choice(p)
    _add_source_args(p)
    _add_mesh_args(p, required=False)
    _add_device_args(p, "for the findings' fits verdict")
    _add_training_args(p)
    _add_output_args(p)
    p.add_argument("-q", "--quiet", action="store_true", help="no findings or summary on stderr")
    p.add_argument("--accelerate-yaml", metavar="FSDP.YAML", help="also write the accelerate config that gives this "
                   "plan (checked with the installed accelerate), naming what it cannot express")
    p.add_argument("--trainer-yaml", metavar="ARGS.YAML", help="also write the Trainer's fsdp / fsdp_config fields "
                   "for this plan (for trl sft --config; checked by reading them back with sv.from_trainer)")
    p.add_argument("--axolotl-yaml", metavar="AXOLOTL.YAML", help="also write the --axolotl-config file with its "
                   "fsdp_config block set for this plan (checked by reading it back with sv.from_axolotl)")
    p.add_argument("--torchtune-overrides", metavar="FILE", help="also write the tune run key=value overrides of the "
                   "--torchtune-config recipe for this plan (checked by running torchtune's shard_model on them)")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("plan", help="write or read plan JSON files")
    plan_sub = p.add_subparsers(dest="plan_command", required=True, parser_class=_Parser)
    w = plan_sub.add_parser("write", help="write the per-block preset for a model as JSON")
    _add_model_args(w)
    w.add_argument("--lora", choices=LORA_OPTIONS, default="sharded")
    _add_checkpoint_arg(w)
    _add_output_args(w)
    w.set_defaults(func=cmd_plan_write)
    _add_search_parser(plan_sub)
    r = plan_sub.add_parser("read", help="validate a plan JSON file; with --model, analyse it")
    r.add_argument("file")
    _add_model_args(r, model_required=False)
    r.add_argument("--model", help=MODEL_HELP)
    _add_mesh_args(r, required=False)
    _add_device_args(r, "for the fits verdict")
    r.set_defaults(func=cmd_plan_read)

    p = sub.add_parser("report", help="write a standalone HTML report (tables, charts, findings, code); "
                                      "print its verdict, step time and top findings")
    _add_model_args(p, model_optional=True)
    _add_plan_choice(p)
    _add_source_args(p)
    _add_mesh_args(p, required=False)
    _add_device_args(p, "draw the limit and flag a peak that does not fit")
    _add_training_args(p)
    _add_allocator_args(p)
    p.add_argument("--no-compare", action="store_true", help="leave out the LoRA options (sharded, ignored, separate) compared side by side")
    _add_output_args(p)
    p.set_defaults(func=cmd_report)
    return parser


def main(argv=None) -> int:
    """The command line; every refusal (a CliError, or a ValueError of any shardviz function) is one
    line on stderr and exit code 2, never a traceback."""
    parser = build_parser()
    try:
        with quiet_libraries():
            return _run(parser, argv)
    except (CliError, ValueError) as exc:
        say(f"error: {' '.join(str(exc).split())}")
        return EXIT_USAGE
    except Refused:
        return EXIT_REFUSED
    except BrokenPipeError:
        return EXIT_OK


def _run(parser, argv) -> int:
    args = parser.parse_args(argv)
    if args.version:
        answer(versions_text())
        return EXIT_OK
    if args.func is None:
        raise CliError("shardviz: a command is required: export, plan or report (see --help)")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
