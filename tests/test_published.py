"""Issue 27, "Must show": the check rows of benchmarks/bench_published.py (not used to calibrate) within
15 % of the published tokens/s, and those of benchmarks/bench_reserved.py within 5 % of the
published reserved peak. The published figures are the runs' own (their sources are in the rows);
the predictions are shardviz's, with the rows' settings (float32 parameters, each cluster's network)."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_published  # noqa: E402
import bench_reserved  # noqa: E402

GiB = 2**30


@pytest.mark.slow
def test_published_check_rows_are_within_15_percent_on_tokens_per_s():
    errors = {}
    for row in bench_published.ROWS:
        if not row.calibration:
            errors[row.n] = bench_published.predict(row)["predicted"] / row.published - 1
    assert len(errors) >= 8
    assert all(abs(e) <= 0.15 for e in errors.values()), errors


@pytest.mark.slow
def test_reserved_check_rows_are_within_5_percent_of_the_published_reserved_peak():
    model = bench_reserved.model()
    errors = {}
    for row in bench_reserved.ROWS:
        what, *_, published, check, _source = row
        if check:
            _, reserved, _ = bench_reserved.predict(row, model)
            errors[what] = reserved / GiB / published - 1
    assert len(errors) >= 2
    assert all(abs(e) <= 0.05 for e in errors.values()), errors


def test_the_torchtitan_rows_train_float32_parameters():
    """torchtitan keeps float32 parameters (only the all-gather is cast): the rows' models must too."""
    model = bench_published.build("llama2_13b")
    assert {p.dtype for p in model.parameters()} == {torch.float32}
