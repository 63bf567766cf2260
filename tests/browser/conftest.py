"""Fixtures for real-browser tests: one JupyterLab server and one headless Chromium per session.

Fixtures
--------
``lab_server``        (session)  a running JupyterLab, :class:`helpers.LabServer`
``playwright_driver`` (session)  the started ``sync_playwright()`` object
``chromium_browser``  (session)  headless Debian Chromium (``/usr/bin/chromium``) via Playwright
``lab_page``          (function) a fresh browser context + page (JupyterLab loads afresh)
``shared_lab_page``   (function) one page for the whole session: JupyterLab loads once and
                                 notebooks open in place (faster; use it for widget tests)
Both page fixtures, on teardown, save the browser console log (artifacts/browser-console/),
a screenshot if the test failed (artifacts/screenshots/FAILED-<test>.png), and shut down every
kernel on the server.

Everything in this folder is marked ``browser`` and put in one xdist group ("jupyterlab"), so
with ``--dist loadgroup`` (as ``scripts/test.sh`` runs) all browser tests share one worker, one
server and one browser instead of competing for the 2 cores.

Helpers: ``from helpers import open_and_run_notebook, make_notebook, save_screenshot``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from playwright.sync_api import expect

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import helpers  # noqa: E402

if Path(helpers.__file__).resolve().parent != HERE:  # pragma: no cover - a clash of names
    raise ImportError(f"'helpers' resolved to {helpers.__file__}, not {HERE / 'helpers.py'}")

WORKER = os.environ.get("PYTEST_XDIST_WORKER", "main")

# The default 5 s is too tight on a loaded 2-core machine (the other xdist worker runs torch).
expect.set_options(timeout=30_000)


GROUP = "jupyterlab"


def _is_browser_item(item) -> bool:
    return HERE in Path(str(item.fspath)).resolve().parents


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    # tryfirst: before `-m` deselection and before xdist reads xdist_group.
    for item in items:
        if _is_browser_item(item):
            item.add_marker(pytest.mark.browser)
            item.add_marker(pytest.mark.xdist_group(GROUP))


class _LoadGroupShim:
    """pytest-xdist 3.8 groups ``--dist loadgroup`` tests by appending ``@group`` to the worker's
    ``item._nodeid``; pytest >= 9.2 keeps the node id in ``item._id`` (a NodeId), so that
    assignment is lost and the group is ignored (browser tests then land on both workers, each
    starting its own JupyterLab). Add the suffix the way the installed pytest stores it, after
    xdist's own hook, only where it is missing."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config, items):
        if not getattr(config.option, "loadgroup", False):
            return
        for item in items:
            if not _is_browser_item(item) or item.nodeid.endswith(f"@{GROUP}"):
                continue
            new_id = f"{item.nodeid}@{GROUP}"
            try:
                if hasattr(item, "_id"):
                    item._id = type(item._id).parse(new_id)
                else:
                    item._nodeid = new_id
            except Exception:  # noqa: BLE001 - grouping is an optimisation only
                return


def pytest_configure(config):
    if not config.pluginmanager.has_plugin("shardviz-browser-loadgroup"):
        config.pluginmanager.register(_LoadGroupShim(), "shardviz-browser-loadgroup")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    report = yield
    setattr(item, f"_browser_rep_{report.when}", report)
    return report


def _require_chromium() -> None:
    if not os.access(helpers.CHROMIUM_PATH, os.X_OK):
        msg = f"{helpers.CHROMIUM_PATH} missing: run ./scripts/setup.sh --browser"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)


@pytest.fixture(scope="session")
def lab_server(tmp_path_factory):
    """A JupyterLab server on a free loopback port; root dir is a fresh temp folder."""
    base = tmp_path_factory.mktemp(f"jupyterlab-{WORKER}")
    server = helpers.start_lab_server(
        root_dir=base / "root",
        home=base / "home",
        log_path=helpers.ARTIFACTS_DIR / f"jupyter-server-{WORKER}.log",
    )
    try:
        yield server
    finally:
        helpers.stop_lab_server(server)


@pytest.fixture(scope="session")
def playwright_driver():
    _require_chromium()
    from playwright.sync_api import sync_playwright

    pw = sync_playwright().start()
    try:
        yield pw
    finally:
        pw.stop()


@pytest.fixture(scope="session")
def chromium_browser(playwright_driver):
    browser = helpers.launch_chromium(playwright_driver)
    try:
        yield browser
    finally:
        browser.close()


def _new_page(browser):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    context.set_default_timeout(30_000)
    page = context.new_page()
    console: list[str] = []
    page.on("console", lambda m: console.append(f"[{m.type}] {m.text}"))
    page.on("pageerror", lambda e: console.append(f"[pageerror] {e}"))
    return context, page, console


def _finish_test(request, page, console: list[str], server) -> None:
    """Per-test teardown: failure screenshot, console log, all kernels shut down."""
    name = "".join(c if c.isalnum() or c in "-_." else "_" for c in request.node.name)
    rep = getattr(request.node, "_browser_rep_call", None)
    if rep is not None and rep.failed:
        try:
            helpers.save_screenshot(page, f"FAILED-{name}")
        except Exception as exc:  # noqa: BLE001 - best effort
            console.append(f"[harness] failure screenshot failed: {exc}")
    logdir = helpers.ARTIFACTS_DIR / "browser-console"
    logdir.mkdir(parents=True, exist_ok=True)
    (logdir / f"{name}.log").write_text("\n".join(console) + "\n")
    console.clear()
    try:
        helpers.shutdown_all_kernels(server)
    except Exception:  # noqa: BLE001 - the server may be gone; the session fixture reports
        pass


@pytest.fixture
def lab_page(request, chromium_browser, lab_server):
    """A new page in its own browser context for one test (1400x1000). Full isolation:
    JupyterLab is loaded afresh by the first ``open_and_run_notebook``."""
    context, page, console = _new_page(chromium_browser)
    try:
        yield page
    finally:
        _finish_test(request, page, console, lab_server)
        context.close()


@pytest.fixture(scope="session")
def _shared_page(chromium_browser, lab_server):
    context, page, console = _new_page(chromium_browser)
    try:
        yield page, console
    finally:
        context.close()


@pytest.fixture
def shared_lab_page(request, _shared_page, lab_server):
    """One page kept for the whole session: JupyterLab loads once, and each
    ``open_and_run_notebook`` closes the previous tabs and opens its notebook in place
    (saves the 5-10 s JupyterLab load per test). Kernels are shut down after each test."""
    page, console = _shared_page
    try:
        yield page
    finally:
        if not page.is_closed() and helpers.lab_is_loaded(page, lab_server):
            try:
                helpers.close_all_documents(page)
            except Exception:  # noqa: BLE001 - the next open_and_run_notebook reloads Lab
                pass
        _finish_test(request, page, console, lab_server)
