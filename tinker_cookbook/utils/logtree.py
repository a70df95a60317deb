"""Logtree: nested HTML reports that follow the structure of the code that writes them (the official cookbook's API).

A trace is opened once (``init_trace``); everything below logs into whatever trace is active in the current asyncio
task, with no handle passed around::

    with logtree.init_trace("Iteration 3", path="iteration_000003/train.html"):
        with logtree.scope_header("Group 0"):        # a <section> with an <h2>; nested scopes get <h3>, <h4>, ...
            logtree.log_text("prompt: What is 2+2?")
            logtree.table_from_dict({"reward": 1.0})

The state lives in context variables, so concurrent rollouts (``asyncio.gather``) each write into the scope that was
open when their task started. Outside a trace, and inside ``scope_disable``, every call does nothing: an env can
log unconditionally and cost nothing when no report is being written.

Beyond the official names, ``detached_trace`` records what a block logs without writing a file (even when no trace
is active) and ``log_trace`` puts such a recording into the active trace: the RL loop records each logged rollout
while it runs (rollouts of several iterations overlap in the async loop) and assembles the iteration's report from
those recordings afterwards.

All text is HTML-escaped; ``log_html`` and formatters insert HTML as given.
"""

from __future__ import annotations

import functools
import html
import inspect
import json
import os
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol, TypeVar, overload


class Formatter(Protocol):
    """An object that renders itself as HTML and brings the CSS that HTML needs (see ``logtree_formatters``).

    A formatter may also define ``to_data() -> dict | None``: structured data kept in the JSON export.
    """

    def to_html(self) -> str: ...

    def get_css(self) -> str: ...


@dataclass
class Node:
    """One HTML element: tag, attributes, and children (nodes, or strings inserted as given: already escaped)."""

    tag: str
    attrs: dict[str, str] = field(default_factory=dict)
    children: list[Node | str] = field(default_factory=list)
    data: dict[str, Any] | None = field(default=None, repr=False)

    def to_html(self, indent: int = 0) -> str:
        pad = "  " * indent
        attrs = "".join(f' {k}="{html.escape(v, quote=True)}"' for k, v in self.attrs.items())
        if all(isinstance(c, str) for c in self.children):
            # Text-only elements stay on one line: extra newlines would show under `white-space: pre-wrap`.
            return f"{pad}<{self.tag}{attrs}>{''.join(self.children)}</{self.tag}>\n"  # type: ignore[arg-type]
        inner = "".join(c if isinstance(c, str) else c.to_html(indent + 1) for c in self.children)
        return f"{pad}<{self.tag}{attrs}>\n{inner}{pad}</{self.tag}>\n"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready tree; a node with ``data`` keeps that instead of its raw-HTML string children."""
        kept = [c for c in self.children if isinstance(c, Node)] if self.data is not None else self.children
        out: dict[str, Any] = {"tag": self.tag, "attrs": dict(self.attrs),
                               "children": [c.to_dict() if isinstance(c, Node) else c for c in kept]}
        if self.data is not None:
            out["data"] = self.data
        return out


@dataclass
class Theme:
    """Page styling: ``css_text`` replaces the built-in CSS, ``css_urls`` are linked, ``css_vars`` set on ``:root``."""

    css_text: str | None = None
    css_urls: list[str] = field(default_factory=list)
    css_vars: dict[str, str] = field(default_factory=dict)


DEFAULT_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 75em; padding: 0 1em; line-height: 1.4; }
.lt-title { margin-bottom: 0; } .lt-subtitle { color: #666; margin-bottom: 1em; }
.lt-section { margin: .4em 0 .4em .6em; padding-left: .6em; border-left: 2px solid #ddd; }
.lt-p { white-space: pre-wrap; margin: .3em 0; }
pre, .prompt, .response { white-space: pre-wrap; word-break: break-word; padding: .4em; border-radius: 4px;
  margin: .3em 0; font-family: ui-monospace, monospace; }
.prompt { background: #eef4ee; } .response { background: #fbeeee; }
.good { border-left: 4px solid #2a2; } .bad { border-left: 4px solid #c33; }
.lt-table { border-collapse: collapse; margin: .3em 0; }
.lt-table td, .lt-table th { border: 1px solid #ccc; padding: 2px 8px; text-align: left; vertical-align: top; }
.lt-table-caption { font-size: .9em; color: #555; margin-top: .4em; }
details { margin: .3em 0; } .lt-exc summary { color: #b00; font-weight: 600; }
"""

_trace: ContextVar[Trace | None] = ContextVar("logtree_trace", default=None)
_containers: ContextVar[tuple[Node, ...]] = ContextVar("logtree_containers", default=())
_levels: ContextVar[tuple[int, ...]] = ContextVar("logtree_levels", default=())
_disabled: ContextVar[bool] = ContextVar("logtree_disabled", default=False)


class Trace:
    """One report: its title, where ``init_trace`` writes it (``path``; None: nowhere) and its tree (``root``)."""

    def __init__(self, title: str, path: str | os.PathLike | None = None, write_on_error: bool = True) -> None:
        self.title = title
        self.path = Path(path) if path is not None else None
        self.write_on_error = write_on_error
        self.started_at = datetime.now()
        self.root = Node("body", {"class": "lt-root"})
        self.formatter_css: list[str] = []  # in first-use order, each once

    def add_css(self, css: str) -> None:
        if css and css not in self.formatter_css:
            self.formatter_css.append(css)

    def body_html(self, wrap_body: bool = True) -> str:
        if wrap_body:
            return self.root.to_html()
        return "".join(c if isinstance(c, str) else c.to_html() for c in self.root.children)

    def get_html(self) -> str:
        return self.body_html(wrap_body=True)

    def head_html(self, theme: Theme | None = None, title: str | None = None, extra_head: str | None = None) -> str:
        theme = theme or Theme()
        parts = [f"<title>{html.escape(title or self.title)}</title>", '<meta charset="UTF-8">',
                 '<meta name="viewport" content="width=device-width, initial-scale=1.0">']
        parts += [f'<link rel="stylesheet" href="{html.escape(url, quote=True)}">' for url in theme.css_urls]
        css = [DEFAULT_CSS if theme.css_text is None else theme.css_text]
        if theme.css_vars:
            css.append(":root {\n" + "".join(f"  {k}: {v};\n" for k, v in theme.css_vars.items()) + "}")
        css += self.formatter_css
        parts.append("<style>\n" + "\n".join(css) + "\n</style>")
        if extra_head:
            parts.append(extra_head)
        return "\n".join(parts)

    def to_html(self, theme: Theme | None = None) -> str:
        """The complete page."""
        return (f'<!doctype html>\n<html lang="en">\n<head>\n{self.head_html(theme)}\n</head>\n'
                f"{self.body_html()}</html>\n")

    def to_dict(self) -> dict[str, Any]:
        return {"title": self.title, "started_at": self.started_at.isoformat(),
                "path": str(self.path) if self.path is not None else None, "root": self.root.to_dict()}


def _write_text(path: Path, text: str) -> None:
    """Write through a temporary file, so a reader (or a crash) never sees half a page."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def _write(trace: Trace) -> None:
    if trace.path is not None:
        write_trace_html(trace, trace.path)


def _enabled() -> bool:
    return _trace.get() is not None and not _disabled.get()


def logging_enabled() -> bool:
    """Whether a call here would record anything (a trace is active and no ``scope_disable`` is in effect)."""
    return _enabled()


def _attrs(**attrs: Any) -> dict[str, str]:
    """Keyword attributes as HTML ones: ``class_`` is ``class``, ``data__x`` is ``data-x``."""
    out = {}
    for key, value in attrs.items():
        if key == "class_":
            key = "class"
        elif key.startswith("data__"):
            key = "data-" + key[len("data__"):]
        out[key] = str(value)
    return out


def _append(node: Node) -> None:
    _containers.get()[-1].children.append(node)


@contextmanager
def _inside(node: Node) -> Iterator[None]:
    token = _containers.set((*_containers.get(), node))
    try:
        yield
    finally:
        _containers.reset(token)


def _next_level() -> int:
    levels = _levels.get()
    return min(6, (levels[-1] if levels else 1) + 1)


def _exception_node(exc: BaseException) -> Node:
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return Node("details", {"class": "lt-exc", "open": "open"},
                [Node("summary", {}, [html.escape(f"Exception: {type(exc).__name__}: {exc}")]),
                 Node("pre", {}, [html.escape(text)])])


@contextmanager
def _activate(trace: Trace) -> Iterator[Trace]:
    tokens = (_trace.set(trace), _containers.set((trace.root,)), _levels.set((1,)), _disabled.set(False))
    try:
        yield trace
    finally:
        _disabled.reset(tokens[3])
        _levels.reset(tokens[2])
        _containers.reset(tokens[1])
        _trace.reset(tokens[0])


# -- trace lifecycle ----------------------------------------------------------------------------------------------


@contextmanager
def init_trace(title: str, path: str | os.PathLike | None = None, *, write_on_error: bool = True
               ) -> Iterator[Trace]:
    """Open a report titled ``title`` (an <h1> and the start time); on exit it is written to ``path`` (if given).

    An exception leaving the block is recorded in the report, which is still written when ``write_on_error``.
    """
    trace = Trace(title, path, write_on_error)
    with _activate(trace):
        _append(Node("h1", {"class": "lt-title"}, [html.escape(title)]))
        _append(Node("div", {"class": "lt-subtitle"},
                     [f"Generated {trace.started_at.isoformat(timespec='seconds')}"]))
        try:
            yield trace
        except BaseException as exc:
            _append(_exception_node(exc))
            if write_on_error:
                _write(trace)
            raise
        _write(trace)


def flush_trace() -> bool:
    """Write the active trace to its path now (a long run's report can be read before it ends); False if none."""
    trace = _trace.get()
    if trace is None or trace.path is None:
        return False
    _write(trace)
    return True


@contextmanager
def detached_trace(title: str = "") -> Iterator[Trace]:
    """Record what the block logs into a trace of its own that is written nowhere (and has no title heading).

    Logging is on inside even when no trace is active outside; ``log_trace`` later puts the recording into a report.
    """
    with _activate(Trace(title)) as trace:
        yield trace


def log_trace(recorded: Trace, *, title: str | None = None) -> None:
    """Insert what ``recorded`` holds into the active trace: under a ``scope_header(title)`` when a title is given,
    otherwise in place. Its formatters' CSS comes along."""
    trace = _trace.get()
    if trace is None or not _enabled():
        return
    for css in recorded.formatter_css:
        trace.add_css(css)
    with scope_header(title) if title is not None else _noop():
        for child in recorded.root.children:
            _containers.get()[-1].children.append(child)


@contextmanager
def _noop() -> Iterator[None]:
    yield


# -- scopes -------------------------------------------------------------------------------------------------------


@contextmanager
def scope_header(title: str, **attrs: Any) -> Iterator[None]:
    """A <section> headed by ``title``; the heading level follows nesting (h2 under the title, then h3, ...)."""
    if not _enabled():
        yield
        return
    level = _next_level()
    section = Node("section", {"class": "lt-section", **_attrs(**attrs)},
                   [Node(f"h{level}", {"class": f"lt-h{level}"}, [html.escape(title)])])
    body = Node("div", {"class": "lt-section-body"})
    section.children.append(body)
    _append(section)
    token = _levels.set((*_levels.get(), level))
    try:
        with _inside(body):
            yield
    finally:
        _levels.reset(token)


F = TypeVar("F", bound=Callable[..., Any])


@overload
def scope_header_decorator(title: str) -> Callable[[F], F]: ...


@overload
def scope_header_decorator(title: F) -> F: ...


def scope_header_decorator(title: str | F) -> F | Callable[[F], F]:
    """Run the function (sync or async) inside ``scope_header(title)``; used bare, the title is its name."""
    name = title if isinstance(title, str) else title.__name__

    def wrap(fn: F) -> F:
        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                with scope_header(name):
                    return await fn(*args, **kwargs)
            return run_async  # type: ignore[return-value]

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            with scope_header(name):
                return fn(*args, **kwargs)
        return run  # type: ignore[return-value]

    return wrap if isinstance(title, str) else wrap(title)


@contextmanager
def scope_div(**attrs: Any) -> Iterator[None]:
    """A <div> (with the given attributes) holding what is logged inside; the heading level does not change."""
    if not _enabled():
        yield
        return
    div = Node("div", _attrs(**attrs))
    _append(div)
    with _inside(div):
        yield


@contextmanager
def scope_details(summary: str) -> Iterator[None]:
    """A collapsed <details> block, shown as ``summary``, holding what is logged inside."""
    if not _enabled():
        yield
        return
    body = Node("div", {"class": "lt-details-body"})
    _append(Node("details", {"class": "lt-details"}, [Node("summary", {}, [html.escape(summary)]), body]))
    with _inside(body):
        yield


@contextmanager
def scope_disable() -> Iterator[None]:
    """Nothing inside is logged."""
    token = _disabled.set(True)
    try:
        yield
    finally:
        _disabled.reset(token)


@contextmanager
def optional_enable_logging(enable: bool) -> Iterator[None]:
    """Pass-through when ``enable``, ``scope_disable`` otherwise."""
    with _noop() if enable else scope_disable():
        yield


# -- content ------------------------------------------------------------------------------------------------------


def log_text(text: str, *, div_class: str | None = None) -> None:
    """A paragraph of text (whitespace kept), or a <div class=div_class> when given."""
    if not _enabled():
        return
    if div_class:
        _append(Node("div", {"class": div_class}, [html.escape(text)]))
    else:
        _append(Node("p", {"class": "lt-p"}, [html.escape(text)]))


def log_html(html_text: str, *, div_class: str | None = None) -> None:
    """Raw HTML, inserted as given, in a <div> (with ``div_class`` when given)."""
    if not _enabled():
        return
    _append(Node("div", {"class": div_class} if div_class else {}, [html_text]))


def log_formatter(formatter: Formatter) -> None:
    """A formatter's HTML; its CSS is added to the page once per trace."""
    trace = _trace.get()
    if trace is None or not _enabled():
        return
    trace.add_css(formatter.get_css())
    to_data = getattr(formatter, "to_data", None)
    _append(Node("div", {}, [formatter.to_html()], data=to_data() if callable(to_data) else None))


def details(text: str, *, summary: str = "Details", pre: bool = True) -> None:
    """A collapsed block of text (in a <pre> when ``pre``)."""
    if not _enabled():
        return
    body = Node("pre" if pre else "div", {"class": "lt-details-body"}, [html.escape(text)])
    _append(Node("details", {"class": "lt-details"}, [Node("summary", {}, [html.escape(summary)]), body]))


def header(text: str, *, level: int | None = None) -> None:
    """A heading without a scope; its level follows nesting unless given (clamped to 1..6)."""
    if not _enabled():
        return
    level = max(1, min(6, level if level is not None else _next_level()))
    _append(Node(f"h{level}", {"class": f"lt-h{level}"}, [html.escape(text)]))


# -- tables -------------------------------------------------------------------------------------------------------


def _cell(value: Any) -> str:
    return html.escape(f"{value:.4g}" if isinstance(value, float) else str(value))


def _table(rows: Sequence[Sequence[Any]], *, caption: str | None, header_row: Sequence[Any] | None) -> None:
    if caption:
        _append(Node("div", {"class": "lt-table-caption"}, [html.escape(caption)]))
    table_node = Node("table", {"class": "lt-table"})
    if header_row is not None:
        table_node.children.append(Node("thead", {}, [Node("tr", {}, [Node("th", {}, [_cell(c)]) for c in header_row])]))
    table_node.children.append(Node("tbody", {}, [Node("tr", {}, [Node("td", {}, [_cell(c)]) for c in row])
                                                  for row in rows]))
    _append(table_node)


def table(obj: Any, *, caption: str | None = None) -> None:
    """A table from a pandas DataFrame, a list of dicts (columns: the first dict's keys) or a list of lists.

    A dict is refused (TypeError): use ``table_from_dict`` or ``table_from_dict_of_lists``.
    """
    if not _enabled():
        return
    if isinstance(obj, Mapping):
        raise TypeError("table() takes a DataFrame, a list of dicts or a list of lists; for a dict use "
                        "table_from_dict (key/value rows) or table_from_dict_of_lists (columns)")
    if hasattr(obj, "to_dict") and hasattr(obj, "columns"):  # a DataFrame, without importing pandas
        obj = obj.to_dict("records")
    if isinstance(obj, list) and not obj:
        if caption:
            _append(Node("div", {"class": "lt-table-caption"}, [html.escape(caption)]))
        return
    if isinstance(obj, list) and isinstance(obj[0], Mapping):
        keys = list(obj[0].keys())
        _table([[row.get(k, "") for k in keys] for row in obj], caption=caption, header_row=keys)
        return
    if isinstance(obj, list) and isinstance(obj[0], (list, tuple)):
        _table(obj, caption=caption, header_row=None)
        return
    raise TypeError(f"table() cannot show a {type(obj).__name__}; pass a DataFrame, a list of dicts or a list of lists")


def table_from_dict(data: Mapping[Any, Any], *, caption: str | None = None, key_header: str = "key",
                    value_header: str = "value", sort_by: str | None = None) -> None:
    """Two columns, one row per item; ``sort_by`` is ``"key"``, ``"value"`` or None (insertion order)."""
    if not _enabled():
        return
    if sort_by not in (None, "key", "value"):
        raise ValueError(f"sort_by={sort_by!r}; use 'key', 'value' or None")
    items = list(data.items())
    if sort_by is not None:
        items.sort(key=lambda kv: kv[0] if sort_by == "key" else kv[1])
    _table(items, caption=caption, header_row=[key_header, value_header])


def table_from_dict_of_lists(columns: Mapping[str, Sequence[Any]], *, caption: str | None = None,
                             order: Sequence[str] | None = None) -> None:
    """One column per key (in ``order`` when given); the lists must have equal lengths."""
    if not _enabled() or not columns:
        return
    lengths = {name: len(values) for name, values in columns.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"table_from_dict_of_lists needs columns of equal length; got {lengths}")
    names = list(order) if order is not None else list(columns)
    n_rows = next(iter(lengths.values()))
    _table([[columns[name][i] for name in names] for i in range(n_rows)], caption=caption, header_row=names)


# -- export -------------------------------------------------------------------------------------------------------


def write_html_with_default_style(body_html: str, path: str | os.PathLike, *, title: str = "Trace",
                                  theme: Theme | None = None, lang: str = "en", extra_head: str | None = None) -> None:
    """Write ``body_html`` as a complete page with this module's styling."""
    head = Trace(title).head_html(theme, title=title, extra_head=extra_head)
    body = body_html if "<body" in body_html else f"<body>\n{body_html}</body>\n"
    _write_text(Path(path), f'<!doctype html>\n<html lang="{html.escape(lang)}">\n<head>\n{head}\n</head>\n{body}</html>\n')


def write_trace_html(trace: Trace, path: str | os.PathLike, theme: Theme | None = None) -> None:
    """The trace as a complete page at ``path`` (what ``init_trace`` writes on exit)."""
    _write_text(Path(path), trace.to_html(theme))


def write_trace_json(trace: Trace, path: str | os.PathLike) -> None:
    """The trace's tree as JSON (``Trace.to_dict``)."""
    _write_text(Path(path), json.dumps(trace.to_dict(), indent=2))


def jinja_context(trace: Trace, **extra: Any) -> dict[str, Any]:
    """Variables for a Jinja template: title, generated_at, started_at, body_html, head_html, and ``extra``."""
    return {"title": trace.title, "generated_at": datetime.now().isoformat(),
            "started_at": trace.started_at.isoformat(), "body_html": trace.body_html(),
            "head_html": trace.head_html(), **extra}


def render_with_jinja(env: Any, template_name: str, *, context: dict[str, Any],
                      write_to: str | os.PathLike | None = None) -> str:
    """Render ``template_name`` of a ``jinja2.Environment`` with ``context``; also written to ``write_to``."""
    text = env.get_template(template_name).render(**context)
    if write_to is not None:
        _write_text(Path(write_to), text)
    return text
