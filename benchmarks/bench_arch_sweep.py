"""How long ``sv.analyze`` with activations takes per architecture of the sweep (tests/hf_archs.py).

Every causal LM of ``test_hf_archs``'s sample (or ``--types``), built on meta from its small
default config, every block checkpointed, batch 1 x ``--seq`` on FSDP 4: the time from
``analyze`` to ``a.memory`` (the measurement of the step included), wall and CPU, slowest first,
and the slowest in one line. Issue 24's target: <= 5 s per architecture. Not a test: the numbers
depend on the load (CPU time less so).
``--zamba-default``: instead, ``sv.analyze`` without activations on Zamba's default config (76 layers).
Run: PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_arch_sweep.py [--types zamba,phi3] [--seq 32] [--zamba-default]
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import shardviz as sv  # noqa: E402
from hf_archs import Unbuildable, build, sample_types  # noqa: E402


def causal_lms(n_types: int) -> list[str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return [t for t in sample_types(n_types) if t in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES]


def time_analyze(model_type: str, seq: int) -> tuple[float, float, str]:
    """(wall s, CPU s, what happened) of analyze -> memory for one architecture."""
    model = build(model_type)
    plan = sv.Plan.auto(model, checkpoint="blocks")  # the step then runs without the cache (HF's rule)
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        a = sv.analyze(model, plan, sv.Mesh(4), sv.Training(batch_size=1, seq_len=seq))
        said = f"peak {sv.format.format_bytes(int(a.memory.peak.max()))}"
    except ValueError as exc:
        said = f"not measured: {str(exc)[:80]}"
    return time.perf_counter() - wall, time.process_time() - cpu, said


def time_zamba_default() -> None:
    """``sv.analyze`` on Zamba's default config (76 layers, transformers' ``ZambaConfig()`` on meta), no
    activations: ``Plan.auto``, ``analyze``, memory, traffic and findings, the run order read included
    (issue 36's target: <= 5 s). Imports are done before the clock starts."""
    import torch
    from transformers import AutoModelForCausalLM, ZambaConfig

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(ZambaConfig())
    sv.ModelTree(torch.nn.Linear(1, 1))  # the walk's lazy imports (peft), outside the clock
    wall, cpu = time.perf_counter(), time.process_time()
    a = sv.analyze(model, sv.Plan.auto(model), sv.Mesh(8))
    a.memory, a.comm, a.findings  # noqa: B018
    print(f"zamba default config ({ZambaConfig().num_hidden_layers} layers), analyze + memory + comm + findings, "
          f"no activations: {time.perf_counter() - wall:.2f} s wall, {time.process_time() - cpu:.2f} s CPU "
          f"(target <= 5 s; run order of {len(a.run_order or ())} modules)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--types", help="comma-separated model types (default: the sweep's causal LMs)")
    parser.add_argument("--seq", type=int, default=32, help="tokens per sequence (the sweep's: 32)")
    parser.add_argument("--n-types", type=int, default=80, help="the sweep's sample size")
    parser.add_argument("--zamba-default", action="store_true",
                        help="only sv.analyze (no activations) on Zamba's default 76-layer config")
    args = parser.parse_args()
    if args.zamba_default:
        time_zamba_default()
        return
    types = args.types.split(",") if args.types else causal_lms(args.n_types)
    rows = []
    for model_type in types:
        try:
            rows.append((model_type, *time_analyze(model_type, args.seq)))
        except Unbuildable as exc:
            print(f"{model_type}: not built ({exc})")
    rows.sort(key=lambda r: -r[1])
    for model_type, wall, cpu, said in rows:
        print(f"{model_type:28s} {wall:6.2f} s wall {cpu:6.2f} s CPU  {said}")
    if rows:
        name, wall, cpu, _ = rows[0]
        print(f"slowest analyze: {name} {wall:.2f} s wall, {cpu:.2f} s CPU (target <= 5 s)")


if __name__ == "__main__":
    main()
