"""``shardviz.libraries``: the messages peft's imports print (torchao's CUDA kernels failing to load on a
CPU machine, torch's pytree deprecation, bitsandbytes' hub kernel offline) stay off the screen when
shardviz imports peft to build a model, as under a notebook cell; the process's logging and warning
settings are as they were afterwards; an error still shows."""

from __future__ import annotations

import logging
import subprocess
import sys
import warnings

import pytest

from shardviz import libraries

# what a fresh process printed under `zoo.llama3_70b()` before (the quickstart notebook's first cell)
NOISE = ("Failed to load", "register_constant", "could not verify publisher trust", "Could not load this library")


def _stderr(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True).stderr


@pytest.mark.parametrize("build", ["zoo.tiny_llama_lora()", "zoo.llama3_8b(lora=True)"])
def test_building_a_lora_model_prints_nothing_of_the_libraries_imports(build):
    err = _stderr(f"from shardviz import zoo\nm = {build}\nimport peft")
    assert not [line for line in err.splitlines() if any(n in line for n in NOISE)], err


def test_without_shardviz_the_same_import_prints_them():
    """The premise, where the extras that print them are installed (torchao, bitsandbytes)."""
    pytest.importorskip("torchao")
    err = _stderr("import peft")
    assert any(n in err for n in NOISE), err


def test_the_loggers_and_warning_filters_are_put_back():
    log = logging.getLogger("torchao")
    log.setLevel(logging.INFO)
    filters = list(warnings.filters)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with libraries.quiet_messages():
            assert log.level == logging.ERROR
            warnings.warn("a library's deprecation", DeprecationWarning, stacklevel=1)  # from outside shardviz
        assert seen == []
    assert log.level == logging.INFO and warnings.filters == filters
    log.setLevel(logging.NOTSET)


def test_an_error_still_shows(caplog):
    with libraries.quiet_messages():
        logging.getLogger("torchao").warning("its CUDA kernels")
        logging.getLogger("torchao").error("a real failure")
    assert [r.getMessage() for r in caplog.records] == ["a real failure"]
