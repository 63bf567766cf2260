"""The Inspector's front end as ES modules, bundled into the one string anywidget loads.

The files of ``front/`` are ES modules: each imports what it uses (``import { h, fmt } from
"../charts.js";``) and exports what others use; ``front/inspector.js`` is the entry, with anywidget's
``export default { render }``. A browser cannot resolve a relative import from the string anywidget
hands it, so this module bundles them, in Python, when the widget class is defined: no npm, no build
step, nothing fetched. The bundle is scope-hoisted, as rollup does it: each module once, after the
modules it imports, with its ``import`` lines dropped and its ``export`` keywords removed, in one
module scope. That is sound because the checks below hold (``ModuleError`` names the file):

- an import names a module of the front end and only names that module exports;
- no two modules declare the same top-level name (one scope: a clash would shadow silently);
- a module uses another module's top-level name only when it imports it (no shared globals).

``charts.js`` is also the HTML report's classic ``<script>`` (``report.py``, ``chart.py``), so it has
no ``export`` statements: its top-level declarations are what it exports.

Development: with ``ANYWIDGET_HMR=1`` (``Inspector`` reads it), the bundle is written to a file
that anywidget watches (its hot reload; needs ``watchfiles``), and a thread here rebuilds that file
when a file of the front end changes, so an edit shows in the open widget without a kernel restart.
"""

from __future__ import annotations

import os
import re
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).parent
ENTRY = HERE / "front" / "inspector.js"

_IMPORT = re.compile(r'^import\s*\{([^}]*)\}\s*from\s*"([^"]+)";[ \t]*\n', re.MULTILINE)
_DECL = re.compile(r"^(export\s+)?(?:async\s+)?(?:function\*?|const|let|class|var)\s+([A-Za-z_$][\w$]*)", re.MULTILINE)
_EXPORT_KW = re.compile(r"^export\s+(?=(?:async\s+)?(?:function|const|let|class|var)\b)", re.MULTILINE)
_DEFAULT = r"^export default\b"
_NAME = re.compile(r"(?<![\w$.])([A-Za-z_$][\w$]*)\b(?!\s*:(?!:))")
# a module's own names at any depth (locals, parameters): they shadow, so they are not another's
_LOCAL = re.compile(r"(?:function\*?|const|let|var|class)\s+([A-Za-z_$][\w$]*)|([A-Za-z_$][\w$]*)\s*=>")
_PARAMS = re.compile(r"(?:function\s*[\w$]*\s*|^|[^\w$])\(([^()]*)\)\s*(?:=>|\{)", re.MULTILINE)
_REGEX_AFTER = set("(,=:[!&|?{};")


def code_only(text: str) -> str:
    """``text`` with comments, strings, the text of template literals and regex literals blanked
    (a template's ``${...}`` stays: it is code): what the name check reads."""
    out: list[str] = []
    i, n = 0, len(text)
    depth: list[int] = []  # brace depth at each open ${ of a template
    braces = 0

    def template(i: int) -> int:  # inside a template literal, from after its opening backtick
        while i < n:
            c = text[i]
            if c == "\\":
                i += 2
            elif c == "`":
                return i + 1
            elif text.startswith("${", i):
                depth.append(braces)
                out.append(" ")
                return -(i + 2)  # back to code, inside ${
            else:
                i += 1
        return i

    while i < n:
        c = text[i]
        if text.startswith("//", i):
            i = text.find("\n", i) if "\n" in text[i:] else n
        elif text.startswith("/*", i):
            i = text.find("*/", i + 2) + 2
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append('""')
            i = j + 1
        elif c == "/" and (text[:i].rstrip()[-1:] in _REGEX_AFTER or text[:i].rstrip().endswith("return")):
            j = i + 1
            cls = False
            while j < n and (cls or text[j] != "/") and text[j] != "\n":
                cls = (cls or text[j] == "[") and text[j] != "]"
                j += 2 if text[j] == "\\" else 1
            out.append(" /r/ ")
            i = j + 1
        elif c == "`" or (c == "}" and depth and depth[-1] == braces):
            if c == "}":
                depth.pop()
            r = template(i + 1)
            out.append(" `` ")
            i = -r if r < 0 else r
        else:
            braces += (c == "{") - (c == "}")
            out.append(c)
            i += 1
    return "".join(out)


class ModuleError(ValueError):
    """A front-end module that does not bundle (bad import, clash, a name used without import)."""


@dataclass
class Module:
    path: Path
    text: str
    imports: dict[Path, list[str]] = field(default_factory=dict)
    declared: list[str] = field(default_factory=list)
    exported: list[str] = field(default_factory=list)
    used: set[str] = field(default_factory=set)

    @property
    def name(self) -> str:  # "front/tree.js", "charts.js": as the modules' folder's parent sees it
        return self.path.name if self.path.parent.name != "front" else f"front/{self.path.name}"

    def body(self) -> str:
        """The module's code in the bundle: no import lines, no export keywords (but the default)."""
        return _EXPORT_KW.sub("", _IMPORT.sub("", self.text))


def read_module(path: Path) -> Module:
    text = path.read_text()
    mod = Module(path, text)
    for names, spec in _IMPORT.findall(text):
        if not spec.startswith("."):
            raise ModuleError(f"{mod.name}: import from {spec!r}: only the front end's own files (./x.js, ../charts.js)")
        target = (path.parent / spec).resolve()
        mod.imports[target] = [n.strip() for n in names.split(",") if n.strip()]
    decls = _DECL.findall(text)
    mod.declared = [n for _, n in decls]
    script = "export " not in text  # charts.js: a classic script too; what it declares is its API
    mod.exported = mod.declared if script else [n for kw, n in decls if kw]
    code = code_only(_IMPORT.sub("", text))
    local = {a or b for a, b in _LOCAL.findall(code)}
    for params in _PARAMS.findall(code):
        local.update(re.findall(r"[A-Za-z_$][\w$]*", re.sub(r"=[^,]*", "", params)))
    mod.used = set(_NAME.findall(code)) - (local - set(mod.declared))
    return mod


def modules(entry: Path = ENTRY) -> list[Module]:
    """The entry and every module it imports, each once, each after what it imports."""
    order: list[Module] = []
    seen: dict[Path, Module | None] = {}

    def visit(path: Path, importer: str) -> Module:
        path = path.resolve()
        if path in seen:
            if seen[path] is None:
                raise ModuleError(f"{importer}: import cycle through {path.name}")
            return seen[path]
        if not path.is_file():
            raise ModuleError(f"{importer}: imports {path.name}, which does not exist")
        seen[path] = None
        mod = read_module(path)
        for target, names in mod.imports.items():
            dep = visit(target, mod.name)
            missing = [n for n in names if n not in dep.exported]
            if missing:
                raise ModuleError(f"{mod.name}: imports {missing} from {dep.name}, which does not export them")
        seen[path] = mod
        order.append(mod)
        return mod

    visit(entry, "the entry")
    _check_names(order)
    return order


def _check_names(order: list[Module]) -> None:
    owner: dict[str, Module] = {}
    for mod in order:
        for name in mod.declared:
            if name in owner:
                raise ModuleError(f"{mod.name} and {owner[name].name} both declare {name!r} (one scope in the bundle)")
            owner[name] = mod
    for mod in order:
        imported = {n for names in mod.imports.values() for n in names}
        foreign = sorted(n for n in mod.used if n in owner and owner[n] is not mod and n not in imported)
        if foreign:
            where = ", ".join(f"{n} ({owner[n].name})" for n in foreign)
            raise ModuleError(f"{mod.name} uses {where} without importing it")
    default = [m.name for m in order if re.search(_DEFAULT, m.text, re.MULTILINE)]
    if default != [order[-1].name]:
        raise ModuleError(f"only the entry module has `export default`; found in {default}")


def bundle(entry: Path = ENTRY) -> str:
    """The one ES module anywidget loads: every module of the front end, scope-hoisted."""
    return "\n".join(f"// ---- {m.name}\n{m.body()}" for m in modules(entry))


def sources(entry: Path = ENTRY) -> list[Path]:
    """The files the bundle is made of (what the development watcher watches)."""
    return [m.path for m in modules(entry)]


def hot_reload_wanted() -> bool:
    return os.environ.get("ANYWIDGET_HMR") == "1"


def dev_bundle_path(entry: Path = ENTRY, poll_s: float = 0.5) -> Path:
    """Development: the bundle written to a file, rebuilt by a daemon thread whenever a file of the
    front end changes (anywidget, given this path as ``_esm``, pushes each rebuild to the page). A
    module that does not bundle leaves the last good bundle and prints the error."""
    out = Path(tempfile.gettempdir()) / f"shardviz-inspector-{os.getpid()}.esm.js"
    out.write_text(bundle(entry))

    def stamp() -> dict[Path, float]:
        return {p: p.stat().st_mtime for p in [*sources(entry), *(entry.parent.glob("*.js"))]}

    def watch() -> None:
        last = stamp()
        while True:
            time.sleep(poll_s)
            try:
                now = stamp()
                if now != last:
                    last = now
                    out.write_text(bundle(entry))
            except (ModuleError, OSError) as exc:
                print(f"shardviz: the front end does not bundle: {exc}")  # noqa: T201 - a developer's terminal

    threading.Thread(target=watch, name="shardviz-front-end-watch", daemon=True).start()
    return out
