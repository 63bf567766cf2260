"""The front end checks every message against the same schema as Python, with the same verdicts:
``checkAction`` (widget/front/base.js, as bundled into the widget's ``_esm``) run under node against ``protocol.check_action``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from shardviz.widget import protocol
from shardviz.widget.bundle import bundle

CASES = [
    ("toggle_unit", {"fqn": "a.b"}),
    ("toggle_unit", {}),
    ("toggle_unit", {"fqn": "a", "evil": 1}),
    ("toggle_unit", {"fqn": 3}),
    ("nope", {}),
    ("set_rank", {"rank": 3}),
    ("set_rank", {"rank": "3"}),
    ("set_rank", {"rank": 1.5}),  # a number: Python then refuses it for not being whole
    ("expand", {"target": "m0", "open": 1}),
    ("set_mesh", {"world": 8, "replicate": 2, "device_gib": None}),
    ("set_mesh", {"device_gib": 0.5}),
    ("set_training", {"batch_size": None, "seq_len": 2048, "param_dtype": None}),
    ("set_training", {"offload": "yes"}),
    ("apply_to_many", {"targets": "g5_6", "action": "checkpoint"}),
    ("apply_to_many", {"targets": ["m1"], "action": "make_unit", "value": None}),
    ("ignore", {"fqns": "x"}),
    ("checkpoint_blocks", {"on": True}),
    ("save_code", {"path": "x.py", "overwrite": False}),
    ("set_mesh", {"device_memory": "80GiB"}),
    ("set_mesh", {"device_memory": 80}),
    ("filter_finding", {}),
    ("dismiss_messages", {}),
]


def test_front_end_and_python_refuse_the_same_messages():
    if shutil.which("node") is None:
        # CI installs node (scripts/setup.sh --node, run by .ci/run), so there a missing node is a failure
        if os.environ.get("CI"):
            pytest.fail("node is not installed, and CI is set: .ci/run's set-up must install it")
        pytest.skip("node is not installed (CI fails instead)")
    src = bundle()  # the ES module the widget ships: widget/front/*.js and charts.js, bundled
    start = src.index("function kindOk(")
    end = src.index("// ---", src.index("function checkAction("))
    script = src[start:end] + f"""
const protocol = {json.dumps(protocol.schema())};
const cases = {json.dumps(CASES)};
console.log(JSON.stringify(cases.map(([a, args]) => checkAction(protocol, a, args))));
"""
    out = subprocess.run(["node", "-e", script], capture_output=True, text=True, timeout=60, check=True).stdout
    js = json.loads(out)
    py = [protocol.check_action(a, args) for a, args in CASES]
    assert [x is None for x in js] == [x is None for x in py], list(zip(CASES, js, py))
    assert py.count(None) == 12  # the cases above: 12 well-formed messages, 10 refused
