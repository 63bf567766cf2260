"""Findings a captured plan needs (``sv.capture``, ``Plan.from_accelerate``), fixes in the user's terms.

| code  | severity | what |
|-------|----------|------|
| SV301 | error    | the user's function (or the framework) raised: the plan is what it did until then |
| SV302 | info     | a checkpoint policy shardviz does not model: priced as full checkpointing |
| SV303 | warning  | no per-layer calls: the blocks share one call (accelerate's ``NO_WRAP``, an unknown layer class) |
| SV304 | warning  | gradients reduced in bf16/fp16 (accelerate's ``mixed_precision: bf16``): what fp32 would cost |
| SV305 | warning  | checkpointing on children of a block rather than on the block |
| SV306 | info     | the framework casts trainable parameters to fp32 before sharding (not priced: the model's dtypes are) |
| SV307 | info     | accelerate's ``parallelism_config`` gives HSDP: the mesh to analyse with |
| SV308 | info     | calls on checkpoint wrappers whose module has its own call: they manage nothing |
| SV309 | info     | explicit prefetch recorded; memory and step time keep torch's default prefetch (not modelled) |

``capture_findings`` runs when the plan is captured (it needs only the model and the calls);
``check_origin`` runs among ``run_checks`` (SV304 prices fp32 with ``AnalysisView.price``);
``in_user_terms`` adds to the engine's own findings (SV001 a tie split by two calls, SV103 trainable
parameters in no call, ...) the fix said where the user makes it: the YAML key, the line of their code.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from .check_inputs import AnalysisView, WhatIfPending, reduce_scatter_sent, worst_peak
from ..finding import Finding
from ..format import format_bytes
from ..plan import Plan
from ..presets import find_blocks
from ..model.tree import as_tree

LOW_PRECISION = ("bfloat16", "float16")
#: Engine findings about particular calls: a captured plan's fix names the lines of those calls.
SITE_CODES = ("SV001", "SV003", "SV004", "SV005", "SV006", "SV007", "SV102", "SV106", "SV109", "SV110")


def _blocks(tree) -> list[str]:
    return [tree.modules[b].fqn for b in find_blocks(tree)]


def no_per_layer_calls(tree, plan: Plan, fix: str) -> list[Finding]:
    """SV303: no block has a call of its own (every block is all-gathered with the call above it)."""
    blocks = _blocks(tree)
    own = {m for u in plan.units for m in u.modules}
    if not blocks or any(b in own for b in blocks) or not plan.units:
        return []
    cls = type_name(tree, blocks[0])
    return [Finding(
        "SV303", "warning",
        f"no per-layer fully_shard calls: the {len(blocks)} {cls} blocks are gathered together by the call above "
        "them, so a rank holds them all unsharded at once", tuple(blocks[:3]),
        fix=fix.format(cls=cls) if fix else f"call fully_shard on each {cls} block before the outer calls",
        n_fqns=len(blocks), all_fqns=tuple(blocks))]


def type_name(tree, fqn: str) -> str:
    return tree.modules[tree.module_index[fqn]].type_name


def checkpoint_on_children(tree, plan: Plan, fix: str) -> list[Finding]:
    """SV305: checkpointed modules strictly inside a block that is not itself checkpointed."""
    blocks = [b for b in _blocks(tree) if b not in plan.checkpoint]
    inside = [c for c in plan.checkpoint if any(c.startswith(b + ".") for b in blocks)]
    if not inside:
        return []
    return [Finding(
        "SV305", "warning",
        f"{len(inside)} modules inside the blocks are checkpointed, not the blocks: each keeps its input "
        "and the block's other activations stay saved", tuple(inside[:3]),
        fix=fix or "wrap each block (the layer) in checkpoint_wrapper instead of its children",
        n_fqns=len(inside), all_fqns=tuple(inside))]


def upcast_trainable(tree, env: dict, seen: tuple | None = None, who: str | None = None) -> list[Finding]:
    """SV306: accelerate's fp32 upcast of trainable parameters that are not fp32, before sharding.

    ``seen``: the trainable parameters the preparation did turn into float32 on the captured copy (None: not
    watched; the upcast is then assumed, as accelerate's code says). ``who`` (``"accelerate 1.13.0"``): the
    preparation is accelerate's own; when it casts none (accelerate 1.13 logs the upcast but rebinds a local
    ``param``, accelerate issue 3979), the finding says the log is not what runs."""
    if env.get("ACCELERATE_MIXED_PRECISION", "no") == "no":
        return []
    low = [p.fqn for p in tree.params if p.requires_grad and p.dtype is not torch.float32]  # a torch.dtype
    cast = low if seen is None else [f for f in low if f in set(seen)]
    if cast:
        return [Finding(
            "SV306", "info",
            f"{who or 'accelerate'} casts {len(cast)} trainable parameters to float32 before sharding (mixed_precision "
            "is not 'no'); shardviz prices the dtypes of the model it is given", tuple(cast[:3]),
            fix="build the model with its trainable parameters in float32 to see the memory accelerate's run uses",
            n_fqns=len(cast), all_fqns=tuple(cast))]
    if not low or who is None:
        return []
    dtype = next(p.dtype for p in tree.params if p.fqn == low[0])
    return [Finding(
        "SV306", "info",
        f"{who}'s fsdp2_prepare_model logs an fp32 upcast of {len(low)} trainable parameters but casts none (it "
        f"rebinds a local param: accelerate issue 3979): they stay {str(dtype).removeprefix('torch.')}, as priced; "
        "a later accelerate casts them", tuple(low[:3]), n_fqns=len(low), all_fqns=tuple(low))]


def accelerate_fixes(env: dict) -> tuple:
    """(code, fix) in the YAML's terms for the findings an accelerate plan can have."""
    size_based = env.get("FSDP_AUTO_WRAP_POLICY") == "SIZE_BASED_WRAP"
    return (("SV301", "in the accelerate config, SIZE_BASED_WRAP also matches a ModuleList of layers once "
                      "fsdp_min_num_params is below a layer's size: use fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP "
                      "(or raise fsdp_min_num_params)"),) * size_based + (
        ("SV303", "in the accelerate config, set fsdp_config.fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP "
                  "(and fsdp_transformer_layer_cls_to_wrap: {cls} when the model's _no_split_modules does not name it)"),
        ("SV304", "accelerate's YAML has no reduce dtype: pass Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin("
                  "fsdp_version=2, mixed_precision_policy={'param_dtype': torch.bfloat16, 'reduce_dtype': torch.float32}))"),
        ("SV305", "set fsdp_config.fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP: fsdp_activation_checkpointing "
                  "wraps what the wrap policy matches"),
        ("SV102", "in the accelerate config, drop these parameters' modules from fsdp_ignored_modules"),
    )


def capture_fixes(fn_name: str) -> tuple:
    """(code, fix) in the terms of the user's function."""
    return (
        ("SV103", f"in {fn_name}: end with fully_shard(model), a root call that takes every parameter no other call "
                  "took (LoRA included), or keep them in the calls of the modules they belong to"),
        ("SV303", f"in {fn_name}: call fully_shard on each {{cls}} block before the outer calls"),
        ("SV305", f"in {fn_name}: wrap each block (the layer) in checkpoint_wrapper, not its children"),
    )


def capture_findings(model, plan: Plan, env: dict | None = None, seen: tuple | None = None,
                     who: str | None = None) -> list[Finding]:
    """What a captured plan shows that the engine's checks do not say (SV303, SV305, SV306; ``seen`` and ``who``:
    ``upcast_trainable``'s)."""
    tree = as_tree(model)
    fixes = plan.origin.fixes if plan.origin else ()
    fix = {c: t for c, t in fixes}
    found = no_per_layer_calls(tree, plan, fix.get("SV303", ""))
    found += checkpoint_on_children(tree, plan, fix.get("SV305", ""))
    found += upcast_trainable(tree, env or {}, seen, who)
    return found


def low_precision_reduce(inputs: AnalysisView) -> list[Finding]:
    """SV304: trainable gradients reduced in bf16/fp16, with what fp32 reduction would cost."""
    plan, training = inputs.plan, inputs.training
    units = [u for u in plan.units if (training.unit_defaults(u).reduce_dtype if training else u.reduce_dtype) in LOW_PRECISION]
    params = inputs.params
    trainable = set(params.loc[params["requires_grad"], "unit"].dropna())
    units = [u for u in units if u.name in trainable]
    if not units:
        return []
    fp32 = plan.with_units([replace(u, reduce_dtype="float32") if u in units else u for u in plan.units])
    dtype = training.unit_defaults(units[0]).reduce_dtype if training else units[0].reduce_dtype
    fix = "MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) on these calls"
    names = tuple(u.name for u in units)
    try:
        other = inputs.price(fp32, traffic=True)
    except WhatIfPending:
        return [Finding("SV304", "warning", f"gradients of {len(units)} calls are reduced in {dtype}: the sum over "
                        "ranks loses precision; what float32 reduction costs is being priced", names[:3], fix=fix,
                        n_fqns=len(units), all_fqns=names, pending=True)]
    rs_now, rs_fp32 = reduce_scatter_sent(inputs.comm), other.reduce_scatter_sent
    peak_now, peak_fp32 = worst_peak(inputs), other.peak
    return [Finding(
        "SV304", "warning",
        f"gradients of {len(units)} calls are reduced in {dtype}: the sum over ranks loses precision. Reducing in "
        f"float32 moves {format_bytes(rs_fp32 - rs_now)} more per step ({format_bytes(rs_now)} -> "
        f"{format_bytes(rs_fp32)} reduce-scatter sent per rank); the peak per rank "
        + (f"grows by {format_bytes(peak_fp32 - peak_now)}" if peak_fp32 > peak_now else "stays as it is"), names[:3],
        fix=fix, n_fqns=len(units), all_fqns=names)]


def check_origin(inputs: AnalysisView) -> list[Finding]:
    """The capture's own findings (SV301-SV306) and SV304, for a captured plan; [] for any other."""
    plan = inputs.plan
    origin = plan.origin
    if origin is None:
        return []
    prefetch = [] if not plan.prefetch else [Finding(
        "SV309", "info", f"{len(plan.prefetch)} explicit prefetch settings (set_modules_to_forward/backward_"
        "prefetch) are recorded in the plan; the memory and the step time assume torch's default prefetch (one call ahead)",
        tuple(m for m, _, _ in plan.prefetch[:3]))]
    return list(origin.findings) + low_precision_reduce(inputs) + prefetch


def in_user_terms(findings: list[Finding], plan: Plan) -> list[Finding]:
    """Each finding's fix followed by where the user makes it: the origin's fix for that code (a YAML
    key), or the lines of their ``fully_shard`` calls that the finding's names fall in."""
    origin = plan.origin
    if origin is None:
        return findings
    sites = dict(origin.call_sites)
    out = []
    for f in findings:
        where = origin.fix_for(f.code)
        if f.code in ("SV303",) or (where and where in f.fix):
            out.append(f)
            continue
        lines = _sites_of(plan, f, sites) if not where and origin.kind == "capture" and f.code in SITE_CODES else []
        extra = where or (f"(your code: {'; '.join(lines)})" if lines else "")
        if extra:
            try:
                extra = extra.format(cls="<layer class>")
            except (KeyError, IndexError):
                pass
        out.append(replace(f, fix=f"{f.fix} In your setup: {extra}".strip()) if extra else f)
    return out


def _sites_of(plan: Plan, finding: Finding, sites: dict) -> list[str]:
    lines = []
    for unit in plan.units:
        site = sites.get(unit.name)
        hit = any(n == m or n.startswith(m + ".") or not m for n in finding.fqns for m in unit.modules if m)
        if site and hit and site not in lines:
            lines.append(f"{unit.name} at {site}")
    return lines[:3]
