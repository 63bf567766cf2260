"""Fixtures shared by the tests in this folder (tests/browser/conftest.py adds the browser's).

Fixtures
--------
``model`` (module)  the zoo's tiny Llama with LoRA (``zoo.tiny_llama_lora()``), built once per test
                    module. A module about another model defines its own ``model``, which wins.

Plain helpers are modules beside the tests, imported by name (``from handmade import Odd``), never
from another test module: ``handmade.py`` (small models, one FSDP2 rule each), ``hf_archs.py``,
``torch_truth.py`` / ``truth_tracker.py`` / ``capture_truth.py`` (what torch did), ``exported_code.py``
(reading and running exported code), ``torchrun_export.py`` (the torchrun harness of exported code).
"""

from __future__ import annotations

import pytest

from shardviz import zoo


@pytest.fixture(scope="module")
def model():
    return zoo.tiny_llama_lora()
