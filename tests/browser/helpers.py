"""Real-browser test harness: a JupyterLab server, headless Debian Chromium, notebook driving.

Used through the fixtures in ``tests/browser/conftest.py`` (``lab_server``,
``chromium_browser``, ``lab_page``); the functions here are importable by tests as
``from helpers import ...`` (this folder is on ``sys.path`` via pytest's rootdir-relative
conftest import) or ``from tests.browser.helpers import ...``.

Design notes
------------
* JupyterLab runs from the test interpreter (``sys.executable -m jupyterlab``): the repo venv.
  Kernels use the kernelspec that ``scripts/setup.sh`` registers inside the venv prefix
  (``.venv/share/jupyter/kernels/python3``, argv = ``.venv/bin/python``). The server gets
  private, empty ``JUPYTER_CONFIG_DIR``/``JUPYTER_DATA_DIR``/``JUPYTER_RUNTIME_DIR`` so that
  nothing in ``~/.jupyter`` or ``~/.local/share/jupyter`` (e.g. another ``python3`` kernelspec)
  can shadow the venv's.
* News/announcements and update checks are off (server ``news_url=None``,
  ``NeverCheckForUpdate``; the announcements plugin is disabled; notification settings say
  never). The network is closed here and the toast would cover the UI.
* ``expose_app_in_browser`` puts the app on ``window.jupyterapp``; notebooks are driven through
  JupyterLab commands rather than key presses, which is far less timing-sensitive.
* Notebook settings: ``windowingMode: none`` (every cell is in the DOM, so tests can read any
  output) and ``autoStartDefaultKernel: true`` (no "Select Kernel" dialog).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

REPO_ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS_DIR = Path(os.environ.get("SHARDVIZ_ARTIFACTS", REPO_ROOT / "artifacts"))
SCREENSHOTS_DIR = ARTIFACTS_DIR / "screenshots"

CHROMIUM_PATH = os.environ.get("SHARDVIZ_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
    "--disable-dev-shm-usage",
]
KERNEL_NAME = "python3"
KERNELSPEC = {"name": KERNEL_NAME, "display_name": "Python 3 (ipykernel)", "language": "python"}

# JupyterLab user settings written for the test server (one file per plugin).
LAB_USER_SETTINGS: dict[str, dict[str, Any]] = {
    "@jupyterlab/notebook-extension/tracker": {
        "windowingMode": "none",
        "autoStartDefaultKernel": True,
    },
    "@jupyterlab/apputils-extension/notification": {
        "fetchNews": "false",
        "checkForUpdates": False,
    },
}
# Plugins switched off in the test server's page config.
LAB_DISABLED_PLUGINS = ["@jupyterlab/apputils-extension:announcements"]


class NotebookRunError(AssertionError):
    """A notebook opened by :func:`open_and_run_notebook` failed to run cleanly."""


# --------------------------------------------------------------------------------------------
# JupyterLab server
# --------------------------------------------------------------------------------------------


@dataclass
class LabServer:
    """A running JupyterLab server (see :func:`start_lab_server`)."""

    port: int
    token: str
    root_dir: Path
    process: subprocess.Popen
    log_path: Path
    home: Path
    _log_file: Any = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def lab_url(self, path: str = "", **query: str) -> str:
        """URL of ``/lab/<path>`` with the token in the query (logs the browser in)."""
        params = "&".join([f"token={self.token}"] + [f"{k}={quote(v)}" for k, v in query.items()])
        return f"{self.url}/lab/{path.lstrip('/')}?{params}"

    def api(self, method: str, path: str, body: Any = None, timeout: float = 10.0) -> Any:
        """Call the server's REST API (``path`` like ``/api/sessions``); returns parsed JSON."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            f"{self.url}{path}",
            data=data,
            method=method,
            headers={"Authorization": f"token {self.token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
        return json.loads(raw) if raw else None

    def log_tail(self, n: int = 60) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        return ""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1))


def _prepare_home(home: Path) -> dict[str, str]:
    """Private Jupyter dirs + config for the test server; returns the env to run it with."""
    config_dir, data_dir, runtime_dir = home / "config", home / "data", home / "runtime"
    for d in (config_dir, data_dir, runtime_dir, home / "ipython", home / "workspaces"):
        d.mkdir(parents=True, exist_ok=True)
    # Server-side: no news feed, no update check (a JSON null is needed: the CLI can't say None).
    _write_json(
        config_dir / "jupyter_server_config.json",
        {
            "LabApp": {
                "news_url": None,
                "check_for_updates_class": "jupyterlab.handlers.announcements.NeverCheckForUpdate",
                "expose_app_in_browser": True,
                "user_settings_dir": str(home / "user-settings"),
                "workspaces_dir": str(home / "workspaces"),
            },
        },
    )
    _write_json(
        config_dir / "labconfig" / "page_config.json",
        {"disabledExtensions": {p: True for p in LAB_DISABLED_PLUGINS}},
    )
    for plugin, values in LAB_USER_SETTINGS.items():
        _write_json(home / "user-settings" / f"{plugin}.jupyterlab-settings", values)

    env = dict(os.environ)
    env.pop("JUPYTER_PATH", None)  # nothing may shadow the venv's kernelspec
    env.update(
        JUPYTER_CONFIG_DIR=str(config_dir),
        JUPYTER_DATA_DIR=str(data_dir),
        JUPYTER_RUNTIME_DIR=str(runtime_dir),
        JUPYTER_PLATFORM_DIRS="1",
        IPYTHONDIR=str(home / "ipython"),
        PYDEVD_DISABLE_FILE_VALIDATION="1",
        PYTHONUNBUFFERED="1",
    )
    return env


def start_lab_server(
    root_dir: Path, home: Path, log_path: Path, *, startup_timeout: float = 90.0
) -> LabServer:
    """Start ``python -m jupyterlab`` on a free loopback port and wait until it answers."""
    root_dir, home = Path(root_dir), Path(home)
    root_dir.mkdir(parents=True, exist_ok=True)
    env = _prepare_home(home)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    last_error = ""
    for _attempt in range(3):  # a free port can be taken between probe and bind: retry
        port, token = free_port(), secrets.token_hex(24)
        cmd = [
            sys.executable, "-m", "jupyterlab",
            "--no-browser",
            "--allow-root",  # CI runs as root; a no-op otherwise
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={port}",
            "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={root_dir}",
            "--ServerApp.disable_check_xsrf=True",
            f"--MappingKernelManager.default_kernel_name={KERNEL_NAME}",
        ]
        log_file = open(log_path, "a", buffering=1)  # noqa: SIM115 - closed in stop_lab_server
        log_file.write(f"\n$ {' '.join(cmd)}\n")
        proc = subprocess.Popen(
            cmd,
            cwd=root_dir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: we can stop it and its kernels
        )
        server = LabServer(port, token, root_dir, proc, log_path, home, log_file)
        deadline = time.monotonic() + startup_timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                last_error = f"jupyter lab exited with {proc.returncode}"
                break
            try:
                server.api("GET", "/api/status", timeout=2)
                # /lab renders the page template: checks the lab assets, not only the API.
                with urllib.request.urlopen(server.lab_url(), timeout=10) as resp:
                    if resp.status == 200:
                        return server
            except (urllib.error.URLError, ConnectionError, OSError) as exc:
                last_error = repr(exc)
            time.sleep(0.25)
        else:
            last_error = f"no answer within {startup_timeout:.0f}s ({last_error})"
        stop_lab_server(server)
    raise RuntimeError(
        f"JupyterLab did not start: {last_error}\n--- {log_path} ---\n"
        + "\n".join(log_path.read_text(errors="replace").splitlines()[-60:])
    )


def stop_lab_server(server: LabServer, timeout: float = 15.0) -> None:
    """Stop the server (SIGTERM -> it shuts its kernels down), then make sure the group is gone."""
    proc = server.process
    if proc.poll() is None:
        with contextlib.suppress(Exception):
            shutdown_all_kernels(server)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)
    # Kernels are in the server's process group; anything left of *that* group goes too.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    if server._log_file is not None:
        server._log_file.close()
        server._log_file = None


def shutdown_all_kernels(server: LabServer) -> None:
    """Delete every session and kernel on the server (between tests)."""
    for sess in server.api("GET", "/api/sessions") or []:
        with contextlib.suppress(urllib.error.HTTPError):
            server.api("DELETE", f"/api/sessions/{sess['id']}")
    for kern in server.api("GET", "/api/kernels") or []:
        with contextlib.suppress(urllib.error.HTTPError):
            server.api("DELETE", f"/api/kernels/{kern['id']}")


# --------------------------------------------------------------------------------------------
# Chromium
# --------------------------------------------------------------------------------------------


def launch_chromium(playwright, **kwargs):
    """Headless Debian Chromium through Playwright (never Playwright's own browser build)."""
    return playwright.chromium.launch(
        executable_path=CHROMIUM_PATH,
        headless=True,
        args=list(CHROMIUM_ARGS),
        **kwargs,
    )


def retake_readme_image(shot: Path, name: str) -> bool:
    """Copy a screenshot over the README's ``docs/img/<name>`` only in a run that asks for it
    (``SHARDVIZ_SCREENSHOTS=1``): an ordinary test run leaves tracked files alone."""
    if os.environ.get("SHARDVIZ_SCREENSHOTS") != "1":
        return False
    shutil.copyfile(shot, REPO_ROOT / "docs" / "img" / name)
    return True


def save_screenshot(target, name: str, *, full_page: bool = False) -> Path:
    """Save a PNG of a Page (or of one element, given a Locator) to artifacts/screenshots/<name>.png."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name).strip("._") or "shot"
    path = SCREENSHOTS_DIR / f"{safe}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    if hasattr(target, "goto"):  # a Page
        target.screenshot(path=str(path), full_page=full_page)
    else:  # a Locator / ElementHandle
        target.screenshot(path=str(path))
    return path


# --------------------------------------------------------------------------------------------
# Notebooks
# --------------------------------------------------------------------------------------------


def make_notebook(*cells: str, markdown: str | None = None):
    """An nbformat v4 notebook of code cells, with the kernelspec metadata set (no kernel dialog)."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = dict(KERNELSPEC)
    nb.metadata["language_info"] = {"name": "python"}
    if markdown:
        nb.cells.append(nbformat.v4.new_markdown_cell(markdown))
    nb.cells.extend(nbformat.v4.new_code_cell(src) for src in cells)
    return nb


def stage_notebook(server: LabServer, nb, name: str | None = None) -> str:
    """Put ``nb`` (a path to an .ipynb, or an nbformat/dict notebook) into the server root.

    Returns its server-relative path. The kernelspec metadata is forced to the venv kernel so
    JupyterLab never asks which kernel to use.
    """
    import nbformat

    if isinstance(nb, (str, os.PathLike)):
        src = Path(nb)
        node = nbformat.read(src, as_version=4)
        name = name or src.name
    else:
        node = nbformat.from_dict(dict(nb))
        name = name or f"nb-{uuid.uuid4().hex[:8]}.ipynb"
    node.metadata["kernelspec"] = dict(KERNELSPEC)
    dest = server.root_dir / name
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest, "w", encoding="utf-8") as f:
        nbformat.write(node, f)
    return dest.relative_to(server.root_dir).as_posix()


# JS run in the page. `window.jupyterapp` exists because of LabApp.expose_app_in_browser.
_JS_FIND_PANEL = """
(path) => {
  const app = window.jupyterapp;
  if (!app || !app.shell) return null;
  for (const w of app.shell.widgets('main')) {
    if (w.context && w.context.path === path && w.content && w.sessionContext) return w.id;
  }
  return null;
}
"""

_JS_START_RUN = """
async ([id]) => {
  const app = window.jupyterapp;
  const panel = Array.from(app.shell.widgets('main')).find(w => w.id === id);
  await panel.context.ready;
  await panel.sessionContext.ready;
  app.shell.activateById(id);
  window.__shardvizRun = { done: false, ok: null, error: null };
  app.commands.execute('notebook:run-all-cells').then(
    ok => { window.__shardvizRun = { done: true, ok: ok !== false, error: null }; },
    err => { window.__shardvizRun = { done: true, ok: false, error: String(err) }; });
}
"""

_JS_KERNEL_STATE = """
([id]) => {
  const app = window.jupyterapp;
  const panel = Array.from(app.shell.widgets('main')).find(w => w.id === id);
  if (!panel) return { missing: true };
  const sc = panel.sessionContext;
  const kernel = sc.session && sc.session.kernel;
  return {
    hasNoKernel: sc.hasNoKernel,
    kernelName: kernel ? kernel.name : null,
    status: kernel ? kernel.status : null,
    connection: kernel ? kernel.connectionStatus : null,
    dialog: !!document.querySelector('.jp-Dialog'),
  };
}
"""

_JS_CELL_REPORT = """
([id]) => {
  const app = window.jupyterapp;
  const panel = Array.from(app.shell.widgets('main')).find(w => w.id === id);
  const cells = panel.content.model.cells;
  const out = [];
  for (let i = 0; i < cells.length; i++) {
    const c = cells.get(i);
    if (c.type !== 'code') continue;
    const errors = [];
    for (let j = 0; j < c.outputs.length; j++) {
      const o = c.outputs.get(j).toJSON();
      if (o.output_type === 'error') errors.push(`${o.ename}: ${o.evalue}`);
    }
    out.push({ index: i, count: c.executionCount, errors });
  }
  return out;
}
"""


_JS_OPEN = """
(path) => {
  window.jupyterapp.commands.execute('docmanager:open', { path, factory: 'Notebook' })
    .catch(err => console.error('docmanager:open failed', err));
}
"""

_JS_CLOSE_ALL = """
() => {
  const app = window.jupyterapp;
  for (const w of Array.from(app.shell.widgets('main'))) {
    if (w.context && w.context.model) w.context.model.dirty = false;  // no "save?" dialog
    w.dispose();
  }
}
"""


def lab_is_loaded(page, server: LabServer) -> bool:
    """True if ``page`` shows a started JupyterLab of ``server``."""
    if not page.url.startswith(f"{server.url}/lab"):
        return False
    return bool(page.evaluate("() => !!(window.jupyterapp && window.jupyterapp.shell)"))


def close_all_documents(page) -> None:
    """Close every tab in JupyterLab's main area without prompting (kernels keep running)."""
    page.evaluate(_JS_CLOSE_ALL)


def _wait_kernel(page, panel_id: str, timeout_ms: float, *, what: str) -> dict:
    deadline = time.monotonic() + timeout_ms / 1000
    state: dict = {}
    idle_since = None
    while time.monotonic() < deadline:
        state = page.evaluate(_JS_KERNEL_STATE, [panel_id])
        if state.get("dialog"):
            text = page.locator(".jp-Dialog").first.inner_text()
            raise NotebookRunError(f"JupyterLab showed a dialog while {what}: {text!r}")
        if state.get("status") == "idle" and state.get("connection") == "connected":
            # Idle twice 200 ms apart: comm/widget traffic right after execution settles.
            if idle_since and time.monotonic() - idle_since > 0.2:
                return state
            idle_since = idle_since or time.monotonic()
        else:
            idle_since = None
        page.wait_for_timeout(100)
    raise NotebookRunError(f"kernel not idle after {timeout_ms / 1000:.0f}s while {what}: {state}")


def open_and_run_notebook(
    page,
    server: LabServer,
    nb_path,
    *,
    name: str | None = None,
    timeout: float = 120_000,
    allow_errors: bool = False,
):
    """Open a notebook in JupyterLab, run all cells, wait for the kernel to be idle.

    ``nb_path`` is a path to an ``.ipynb`` (copied into the server root) or an in-memory
    notebook (nbformat node or dict, e.g. from :func:`make_notebook`), written there as
    ``name``. On a page that is not showing this server's JupyterLab yet, JupyterLab is loaded
    in a fresh, private workspace (no notebook from an earlier test is restored); on a page
    that already shows it (``shared_lab_page``), open tabs are closed and the notebook is
    opened in place, which is much faster. Raises :class:`NotebookRunError` if a cell raised (unless ``allow_errors``), a
    dialog appeared, or the kernel did not settle within ``timeout`` ms.

    Returns a Playwright ``Locator`` for the notebook panel, to find outputs in.
    """
    rel = stage_notebook(server, nb_path, name)
    if lab_is_loaded(page, server):
        # Reuse the loaded JupyterLab (saves the ~5-10 s page load): close what is open,
        # then open the notebook through the document manager.
        close_all_documents(page)
        page.evaluate(_JS_OPEN, rel)
    else:
        workspace = f"t{uuid.uuid4().hex[:10]}"
        page.goto(server.lab_url(f"workspaces/{workspace}/tree/{quote(rel)}"), timeout=timeout)
    page.wait_for_function("() => !!(window.jupyterapp && window.jupyterapp.shell)", timeout=timeout)
    handle = page.wait_for_function(_JS_FIND_PANEL, arg=rel, timeout=timeout)
    panel_id = handle.json_value()
    # The kernel is started from the notebook's kernelspec metadata, with no dialog.
    state = _wait_kernel(page, panel_id, timeout, what=f"starting the kernel for {rel}")
    if state.get("kernelName") != KERNEL_NAME:
        raise NotebookRunError(f"{rel}: unexpected kernel {state}")
    page.evaluate(_JS_START_RUN, [panel_id])
    page.wait_for_function("() => window.__shardvizRun && window.__shardvizRun.done", timeout=timeout)
    run = page.evaluate("() => window.__shardvizRun")
    _wait_kernel(page, panel_id, timeout, what=f"running {rel}")
    report = page.evaluate(_JS_CELL_REPORT, [panel_id])
    errors = [f"cell {c['index']}: {e}" for c in report for e in c["errors"]]
    not_run = [c["index"] for c in report if c["count"] is None]
    if not allow_errors and (errors or not_run or not run.get("ok")):
        raise NotebookRunError(
            f"{rel} did not run cleanly: errors={errors} cells_not_run={not_run} run={run}"
        )
    return page.locator(f'[id="{panel_id}"]')


__all__ = [
    "ARTIFACTS_DIR",
    "CHROMIUM_ARGS",
    "CHROMIUM_PATH",
    "LabServer",
    "NotebookRunError",
    "REPO_ROOT",
    "SCREENSHOTS_DIR",
    "close_all_documents",
    "lab_is_loaded",
    "launch_chromium",
    "make_notebook",
    "open_and_run_notebook",
    "save_screenshot",
    "shutdown_all_kernels",
    "stage_notebook",
    "start_lab_server",
    "stop_lab_server",
]
