"""Predicted reserved peaks against published ones: the tables of docs/reserved.md (``--docs``) and
of docs/cost-model.md, "Reserved memory".

Each row is a published FSDP2 run whose ``torch.cuda.max_memory_reserved`` was logged (torchtitan's
``memory:`` field); the prediction is ``a.memory.reserved_peak`` for the same model, ranks, micro-batch
and checkpointing, with torch's default allocator and with ``expandable_segments``. The model has
torchtitan's float32 parameters and layout (``bench_published.torchtitan_weights``,
``torchtitan_plan``). None of these rows was used to build the allocator model (its rules are
torch's, docs/cost-model.md); the check rows are far off (open, docs/cost-model.md says why). Run
(a few minutes: every row measures a step under FakeTensorMode):

    .venv/bin/python benchmarks/bench_reserved.py          # the table, printed
    .venv/bin/python benchmarks/bench_reserved.py --docs   # writes docs/reserved.md (tests/test_reserved_doc.py)
"""

from __future__ import annotations

import warnings

warnings.filterwarnings("ignore")

import shardviz as sv  # noqa: E402
from bench_published import torchtitan_plan, torchtitan_weights  # noqa: E402
from shardviz import zoo  # noqa: E402

GiB = 2**30
TABLE_1 = "pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md, Table 1 'FSDP'"
TABLE_3 = "pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md, Table 3 'FSDP'"
PR_132445 = "pytorch/pytorch PR 132445, 'Before' (after PR 129721), steps >= 2"
# (what, ranks, micro-batch, seq, checkpoint, published reserved GiB, a check row?, source). All on
# Grand Teton H100s with 96 GB (PR 132445's log: 77.29 GiB is 81.32 % of the device).
ROWS = [
    ("Llama-3-8B, FSDP 8 x H100 (96 GB), no AC", 8, 1, 8192, None, 77.29, False, PR_132445),
    ("Llama-3.1-8B, FSDP 8 x H100 (96 GB), selective op", 8, 2, 8192, "selective", 82.4, True, TABLE_1),
    ("Llama-3.1-8B, FSDP 128 x H100 (96 GB), selective op", 128, 2, 8192, "selective", 67.0, True, TABLE_3),
]


def model():
    m = zoo.llama3_8b(lora=False)
    m.config.use_cache = False  # torchtitan's Llama keeps no cache
    return torchtitan_weights(m)  # float32 parameters, gradients and AdamW states, as torchtitan's


def predict(row, m) -> tuple[int, int, int]:
    """(allocated peak, reserved peak, reserved peak with expandable segments) in bytes for ``row``."""
    _, ranks, batch, seq, ckpt, *_ = row
    plan = torchtitan_plan(m, ckpt)
    tr = sv.Training(batch_size=batch, seq_len=seq, param_dtype="bfloat16", reduce_dtype="float32")
    out = []
    for expandable in (False, True):
        a = sv.analyze(m, plan, sv.Mesh(ranks, device="H100-500W", expandable_segments=expandable), tr)
        out.append((int(a.memory.peak.max()), int(a.memory.reserved_peak.max())))
    (peak, reserved), (_, grown) = out
    return peak, reserved, grown


def main(argv=None) -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", action="store_true", help="write docs/reserved.md")
    if ap.parse_args(argv).docs:
        from reserved_doc import DOC, markdown

        DOC.write_text(markdown())
        print(f"wrote {DOC}")
        return
    m = model()
    print(f"{'run':54} {'use':>5} {'published':>10} {'allocated':>10} {'reserved':>10} {'vs pub.':>8} "
          f"{'expandable':>11} {'vs pub.':>8}")
    for row in ROWS:
        what, *_, published, check, source = row
        peak, reserved, grown = predict(row, m)
        print(f"{what:54} {'check' if check else '–':>5} {published:>10} {peak / GiB:>10.2f} {reserved / GiB:>10.2f} "
              f"{100 * (reserved / GiB / published - 1):>+7.1f}% {grown / GiB:>11.2f} "
              f"{100 * (grown / GiB / published - 1):>+7.1f}%   ({source})")


if __name__ == "__main__":
    main()
