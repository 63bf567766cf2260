"""Fixtures shared by the tests in this folder (tests/browser/conftest.py adds the browser's).

Fixtures
--------
``model`` (module)  the zoo's tiny Llama with LoRA (``zoo.tiny_llama_lora()``), built once per test
                    module. A module about another model defines its own ``model``, which wins.
``st``              an ``InspectorState`` of ``model`` on ``widget_helpers.MESH`` (4 ranks).
``ins``             an ``Inspector`` widget of ``model`` on ``widget_helpers.MESH``.
``no_network``      any attempt to open a connection fails the test (and the hub is told it is
                    offline); a module that must stay offline throughout takes it with
                    ``pytestmark = pytest.mark.usefixtures("no_network")``.

Plain helpers are modules beside the tests, imported by name (``from handmade import Odd``), never
from another test module: ``handmade.py`` (small models, one FSDP2 rule each), ``hf_archs.py``,
``torch_truth.py`` / ``truth_tracker.py`` / ``capture_truth.py`` (what torch did), ``exported_code.py``
(reading and running exported code), ``torchrun_export.py`` (the torchrun harness of exported code),
``widget_helpers.py`` (the Inspector tests' module names and checks).
"""

from __future__ import annotations

import socket

import pytest

from shardviz import zoo


@pytest.fixture(scope="module")
def model():
    return zoo.tiny_llama_lora()


@pytest.fixture
def st(model):
    from shardviz.widget import InspectorState
    from widget_helpers import MESH

    return InspectorState(model, mesh=MESH)


@pytest.fixture
def ins(model):
    from shardviz.widget import Inspector
    from widget_helpers import MESH

    return Inspector(model, mesh=MESH)


@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to open a connection fails the test."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
