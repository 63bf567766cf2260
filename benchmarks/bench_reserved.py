"""Predicted reserved peaks against published ones: the table of docs/cost-model.md, "Reserved memory".

Each row is a published FSDP2 run whose ``torch.cuda.max_memory_reserved`` was logged (torchtitan's
``memory:`` field); the prediction is ``a.memory.reserved_peak`` for the same model, ranks, micro-batch
and checkpointing, with and without ``expandable_segments``. None of these rows was used to build
the allocator model (its rules are torch's, docs/cost-model.md). Run (a few minutes: every row
measures a step under FakeTensorMode):

    .venv/bin/python benchmarks/bench_reserved.py
"""

from __future__ import annotations

import warnings

warnings.filterwarnings("ignore")

import shardviz as sv  # noqa: E402
from shardviz import zoo  # noqa: E402

GiB = 2**30
# (what, micro-batch, seq, checkpoint, published reserved GiB or None, source)
ROWS = [
    ("Llama-3-8B, FSDP 8 x H100, no AC", 1, 8192, None, 77.29,
     "pytorch/pytorch PR 132445, 'Before' (after PR 129721), steps >= 2"),
    ("Llama-3.1-8B, FSDP 8 x H100 (96 GB), selective", 2, 8192, "selective", 82.4,
     "pytorch/torchtitan docs/performance.md, Table 1 'FSDP' (torchtitan's selective op AC)"),
]


def main() -> None:
    model = zoo.llama3_8b(lora=False)
    model.config.use_cache = False  # torchtitan's Llama keeps no cache
    training = dict(param_dtype="bfloat16", reduce_dtype="float32")
    print(f"{'run':50} {'published':>10} {'allocated':>10} {'reserved':>10} {'vs pub.':>8} {'expandable':>11}")
    for what, batch, seq, ckpt, published, source in ROWS:
        plan = sv.Plan.auto(model, checkpoint=ckpt)
        tr = sv.Training(batch_size=batch, seq_len=seq, **training)
        out = []
        for expandable in (False, True):
            a = sv.analyze(model, plan, sv.Mesh(8, device="H100", expandable_segments=expandable), tr)
            out.append((int(a.memory.peak.max()), int(a.memory.reserved_peak.max())))
        (peak, reserved), (_, grown) = out
        delta = f"{100 * (reserved / GiB / published - 1):+.1f}%" if published else "–"
        print(f"{what:50} {published or '–':>10} {peak / GiB:>10.2f} {reserved / GiB:>10.2f} {delta:>8} "
              f"{grown / GiB:>11.2f}   ({source})")


if __name__ == "__main__":
    main()
