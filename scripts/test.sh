#!/usr/bin/env bash
# Run the test suite: ./scripts/test.sh [pytest args...]
#
# Sets up .venv first (./scripts/setup.sh --browser: a no-op when nothing changed), runs ruff (lint
# only, rules in pyproject.toml) and lint-imports (the layers contract in pyproject.toml), then pytest
# on 2 workers. Browser tests share one worker (--dist loadgroup, group "jupyterlab"), so one
# JupyterLab server and one Chromium serve them all.
# Artifacts: artifacts/pytest.log, artifacts/junit.xml, artifacts/screenshots/*.png,
# artifacts/jupyter-server-*.log, artifacts/browser-console/*.log.
#   ./scripts/test.sh -m 'not slow'        quick local run
#   ./scripts/test.sh tests/browser        browser tests only
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

./scripts/setup.sh --browser --torchtune --axolotl   # the framework venvs too: their tests run here as in CI

mkdir -p artifacts
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1   # Debian's /usr/bin/chromium is used, never a download

.venv/bin/ruff check .   # lint first: a lint error fails the run before any test starts
.venv/bin/lint-imports   # the layers: an upward import fails the run too

set +e
.venv/bin/python -m pytest -n 2 --dist loadgroup -q \
  --junitxml=artifacts/junit.xml "$@" 2>&1 | tee artifacts/pytest.log
rc=${PIPESTATUS[0]}
set -e
exit "$rc"
