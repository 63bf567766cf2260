"""How long ``sv.capture`` and ``sv.Plan.from_accelerate`` take against one cold ``sv.analyze``.

Llama-3.1-70B + LoRA (meta, no download) on 64 ranks. Cold analyze: a fresh model object, the
per-block preset, ``a.memory`` and ``a.findings`` built (the tree walk included). Capture: another
fresh model, a torchtitan-style function (blocks, [norm, lm_head], root) run on a meta copy under the
fake group and read back. from_accelerate: a fresh model through accelerate's own FSDP2 preparation
(TRANSFORMER_BASED_WRAP, bf16). Target (issue 26): capture <= 2 x one cold analyze, judged on CPU time
(wall time is printed too: on a shared machine it swings with the load).
Run: .venv/bin/python benchmarks/bench_capture.py [--model llama3_70b] [--world 64]
"""

from __future__ import annotations

import argparse
import time
import warnings

warnings.filterwarnings("ignore")

import shardviz as sv  # noqa: E402
from shardviz import zoo  # noqa: E402


class Clock:
    def __enter__(self):
        self._wall, self._cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        self.wall, self.cpu = time.perf_counter() - self._wall, time.process_time() - self._cpu


def titan_style(model):
    from torch.distributed.fsdp import fully_shard

    inner = model.base_model.model
    for layer in inner.model.layers:
        fully_shard(layer)
    fully_shard([inner.model.norm, inner.lm_head], reshard_after_forward=False)
    fully_shard(model)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama3_70b")
    ap.add_argument("--world", type=int, default=64)
    args = ap.parse_args()
    build, mesh = getattr(zoo, args.model), sv.Mesh(args.world)

    model = build()
    with Clock() as analyze:
        a = sv.analyze(model, sv.Plan.auto(model), mesh)
        a.memory, a.findings
    model = build()
    with Clock() as capture:
        plan = sv.capture(titan_style, model, mesh=mesh)
    model = build()
    config = {"fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP", "mixed_precision": "bf16"}
    with Clock() as accelerate:
        acc = sv.Plan.from_accelerate(model, config, mesh=mesh)
    print(f"{args.model} + LoRA on {args.world} ranks: {len(plan.units)} captured calls, {len(acc.units)} from accelerate")
    for name, c in (("cold analyze", analyze), ("capture", capture), ("from_accelerate", accelerate)):
        ratio = "" if c is analyze else f"  {c.cpu / analyze.cpu:.2f} x cold analyze (CPU)"
        print(f"  {name:16s} {c.cpu:6.2f} s CPU  {c.wall:6.2f} s wall{ratio}")
    verdict = "met" if capture.cpu <= 2 * analyze.cpu else "NOT met"
    print(f"target capture <= 2 x one cold analyze (CPU time): {verdict}")


if __name__ == "__main__":
    main()
