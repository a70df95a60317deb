"""A small HTML report: headers, text, tables and collapsible sections, written as one self-contained file.

Used by the RL loop for per-iteration rollout transcripts (prompt, sampled response, reward) that a person can
open in a browser::

    report = HtmlReport("Iteration 3")
    report.header("Group 0")
    report.table({"reward": 1.0, "correct": 1.0})
    with report.details("Transcript"):
        report.text(prompt_text, css_class="prompt")
    report.write(path)

All text is HTML-escaped.
"""

from __future__ import annotations

import html
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; max-width: 70em; }
h1, h2, h3 { font-weight: 600; }
pre { white-space: pre-wrap; word-break: break-word; padding: .5em; border-radius: 4px; margin: .3em 0; }
.prompt { background: #eef4ee; }
.response { background: #fbeeee; }
.good { border-left: 4px solid #2a2; } .bad { border-left: 4px solid #c33; }
table { border-collapse: collapse; margin: .3em 0; }
td, th { border: 1px solid #ccc; padding: 2px 8px; text-align: left; }
details { margin: .3em 0 .3em 1em; }
"""


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return html.escape(str(value))


class HtmlReport:
    """Collects HTML fragments in order; ``write`` saves them as a complete page."""

    def __init__(self, title: str) -> None:
        self.title = title
        self._parts: list[str] = [f"<h1>{html.escape(title)}</h1>"]

    def header(self, text: str, level: int = 2) -> None:
        level = min(max(level, 1), 6)
        self._parts.append(f"<h{level}>{html.escape(text)}</h{level}>")

    def text(self, text: str, css_class: str | None = None) -> None:
        """Preformatted text (whitespace kept), optionally with a CSS class such as ``prompt`` or ``response``."""
        attr = f' class="{html.escape(css_class)}"' if css_class else ""
        self._parts.append(f"<pre{attr}>{html.escape(text)}</pre>")

    def table(self, row: Mapping[str, Any]) -> None:
        """A two-column key/value table."""
        body = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{_cell(v)}</td></tr>" for k, v in row.items())
        self._parts.append(f"<table>{body}</table>")

    def table_rows(self, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        """A table with a header row."""
        head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
        body = "".join("<tr>" + "".join(f"<td>{_cell(v)}</td>" for v in row) + "</tr>" for row in rows)
        self._parts.append(f"<table><tr>{head}</tr>{body}</table>")

    @contextmanager
    def details(self, summary: str, open_: bool = False) -> Iterator[None]:
        """A collapsible section holding what is added inside the ``with`` block."""
        self._parts.append(f"<details{' open' if open_ else ''}><summary>{html.escape(summary)}</summary>")
        try:
            yield
        finally:
            self._parts.append("</details>")

    def to_html(self) -> str:
        return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(self.title)}</title>"
                f"<style>{_STYLE}</style></head><body>{''.join(self._parts)}</body></html>")

    def write(self, path: str | Path) -> Path:
        """Write the page (parent directories are created) and return its path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(self.to_html(), encoding="utf-8")
        tmp.replace(path)
        return path
