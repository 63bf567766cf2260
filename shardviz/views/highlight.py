"""Python syntax highlighting for the exported code: the one highlighter (pygments), for the
Inspector's export panel and the HTML report.

The HTML uses the ``sv-tok-*`` classes of ``widget/inspector.css``, which take their colours from
JupyterLab's theme variables (light and dark); the report inlines the same CSS.
"""

from __future__ import annotations

import html

from pygments.lexers import PythonLexer
from pygments.token import Comment, Keyword, Name, Number, Operator, String

#: pygments token kinds -> CSS class, most specific first (a token matches its kind's subtypes).
_CLASSES = (
    (Name.Decorator, "sv-tok-deco"),
    (Name.Function, "sv-tok-def"),
    (Name.Class, "sv-tok-def"),
    (Name.Builtin, "sv-tok-builtin"),
    (Keyword, "sv-tok-kw"),
    (Operator.Word, "sv-tok-kw"),
    (String, "sv-tok-str"),
    (Comment, "sv-tok-com"),
    (Number, "sv-tok-num"),
)


def _css_class(kind) -> str | None:
    return next((cls for token, cls in _CLASSES if kind in token), None)


def python_html(code: str) -> str:
    """``code`` as escaped HTML with ``<span class="sv-tok-...">`` around the highlighted tokens
    (to be put inside ``<pre class="sv-code"><code>``)."""
    runs: list[list] = []  # [class, text]: neighbouring tokens of one class in one span
    for kind, text in PythonLexer(stripnl=False, ensurenl=False).get_tokens(code):
        cls = _css_class(kind) if text.strip() else None
        if runs and runs[-1][0] == cls:
            runs[-1][1] += text
        else:
            runs.append([cls, text])
    return "".join(f'<span class="{cls}">{html.escape(text, quote=False)}</span>' if cls else html.escape(text, quote=False)
                   for cls, text in runs)
