"""The Inspector in Jupyter Notebook 7 (the ``notebook`` package), not only in JupyterLab: the
same anywidget renders, a click round-trips to the kernel, and the numbers are analyze's."""

from __future__ import annotations

import secrets
import subprocess
import sys
import time
import urllib.request

import pytest
from helpers import (
    ARTIFACTS_DIR,
    KERNEL_NAME,
    _prepare_home,
    free_port,
    make_notebook,
    save_screenshot,
    stage_notebook,
)
from inspector_page import saved_plan
from playwright.sync_api import expect

import shardviz as sv
from shardviz import zoo

pytestmark = [pytest.mark.browser, pytest.mark.slow]
PLAN_FILE = "plan-nb7.json"
L0 = "base_model.model.model.layers.0"


@pytest.fixture(scope="module")
def notebook_server(tmp_path_factory):
    pytest.importorskip("notebook", minversion="7")
    base = tmp_path_factory.mktemp("notebook7")
    root, home = base / "root", base / "home"
    root.mkdir()
    env = _prepare_home(home)
    port, token = free_port(), secrets.token_hex(24)
    log = open(ARTIFACTS_DIR / "notebook7-server.log", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", "notebook", "--no-browser", "--allow-root", "--ServerApp.ip=127.0.0.1",
         f"--ServerApp.port={port}", "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
         f"--ServerApp.root_dir={root}", "--ServerApp.disable_check_xsrf=True",
         "--JupyterNotebookApp.expose_app_in_browser=True",
         f"--MappingKernelManager.default_kernel_name={KERNEL_NAME}"],
        cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/tree?token={token}", timeout=5) as r:
                if r.status == 200:
                    break
        except OSError:
            time.sleep(0.3)
    else:
        proc.kill()
        pytest.fail("Jupyter Notebook 7 did not start: see artifacts/notebook7-server.log")

    class Server:
        root_dir = root

    server = Server()
    server.url, server.token = url, token
    try:
        yield server
    finally:
        import os
        import signal

        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


def test_inspector_in_notebook7(notebook_server, chromium_browser):
    model = zoo.tiny_llama_lora()
    nb = make_notebook(
        "import shardviz as sv\nfrom shardviz import zoo\n"
        f"inspector = sv.Inspector(zoo.tiny_llama_lora(), mesh=sv.Mesh(shard=4), plan_path={PLAN_FILE!r})\n"
        "inspector\n"
    )
    rel = stage_notebook(notebook_server, nb, "inspector_nb7.ipynb")
    context = chromium_browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(f"{e}\n{e.stack}"))
    try:
        page.goto(f"{notebook_server.url}/notebooks/{rel}?token={notebook_server.token}")
        page.wait_for_function("() => !!(window.jupyterapp && window.jupyterapp.shell && window.jupyterapp.shell.currentWidget"
                               " && window.jupyterapp.shell.currentWidget.sessionContext)", timeout=120_000)
        page.wait_for_function("() => { const k = window.jupyterapp.shell.currentWidget.sessionContext.session;"
                               " return k && k.kernel && k.kernel.status === 'idle'; }", timeout=120_000)
        page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
        widget = page.locator(".sv-inspector")
        expect(widget.locator(".sv-row[data-id='m0']")).to_be_visible(timeout=120_000)
        a = sv.analyze(model, sv.Plan.auto(model), sv.Mesh(shard=4),
                       sv.Training(optimizer="adamw", param_dtype="bfloat16", reduce_dtype="float32"))
        expect(widget.locator(".sv-sum-peak")).to_have_attribute("data-bytes", str(int(a.memory["peak"].max())))
        # a click goes to the kernel and back: the plan file and the page follow
        for fqn in ("base_model", "base_model.model", "base_model.model.model", "base_model.model.model.layers"):
            widget.locator(f'.sv-row[data-fqn="{fqn}"] .sv-caret').click()
            expect(widget.locator(f'.sv-row[data-fqn="{fqn}"] .sv-caret')).to_have_attribute("aria-label", "collapse")
        widget.locator('.sv-row[data-group="layers.0-1"] .sv-caret').click()
        block = widget.locator(f'.sv-row[data-fqn="{L0}"]')
        block.locator(".sv-act-unit").click()
        want = sv.Plan.auto(model).without_unit(L0)
        assert saved_plan(notebook_server, PLAN_FILE, until=want.__eq__) == want
        b = sv.analyze(model, want, sv.Mesh(shard=4), sv.Training(optimizer="adamw", param_dtype="bfloat16", reduce_dtype="float32"))
        expect(widget.locator(".sv-sum-peak")).to_have_attribute("data-bytes", str(int(b.memory["peak"].max())))
        expect(widget.locator(".sv-plan-name")).to_have_text("auto (LoRA sharded), edited: 1 change")
        save_screenshot(page, "inspector_notebook7")
        # Notebook 7.6 itself logs one TypeError while loading its settings (notebook_core, with
        # the private, empty settings dirs of this test server); none may come from the widget
        ours = [e for e in errors if "anywidget" in e or "blob:" in e or "sv-" in e or "notebook_core" not in e]
        assert ours == [], ours
    finally:
        context.close()
