"""The interpreter of a framework's own venv (torchtune and axolotl pin what peft refuses: scripts/setup.sh
--torchtune / --axolotl make ``.venv-<name>``): skipped locally when missing, a failure under CI."""

from __future__ import annotations

import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def framework_python(name: str) -> str:
    path = os.environ.get(f"SHARDVIZ_{name.upper()}_PYTHON") or os.path.join(ROOT, f".venv-{name}", "bin", "python")
    if not os.path.exists(path):
        if os.environ.get("CI"):
            pytest.fail(f"{path} missing, and CI is set: .ci/run's set-up (scripts/setup.sh --{name}) must make it")
        pytest.skip(f"no {name} venv at {path} (scripts/setup.sh --{name}; CI fails instead)")
    return path
