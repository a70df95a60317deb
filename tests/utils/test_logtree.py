"""logtree: the official tracing API (scopes, text, tables, formatters, export) on our implementation."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from tinker_cookbook.utils import logtree
from tinker_cookbook.utils.logtree_formatters import ConversationFormatter


def _headings(html_text: str) -> list[tuple[int, str]]:
    return [(int(level), text) for level, text in re.findall(r'<h(\d) class="lt-h\d">([^<]*)</h\d>', html_text)]


def test_scopes_nest_headings_and_the_page_is_written_on_exit(tmp_path):
    path = tmp_path / "sub" / "report.html"
    with logtree.init_trace("Report", path=path) as trace:
        with logtree.scope_header("Sampling"):
            logtree.log_text("a < b & c")
            with logtree.scope_header("Group 0"):
                logtree.header("inline")
        with logtree.scope_header("Training"):
            pass
        assert not path.exists()  # written when the trace closes, not before
    page = path.read_text()
    assert page.startswith("<!doctype html>") and "<title>Report</title>" in page
    assert _headings(page) == [(2, "Sampling"), (3, "Group 0"), (4, "inline"), (2, "Training")]
    assert '<p class="lt-p">a &lt; b &amp; c</p>' in page  # text is escaped
    assert trace.to_dict()["title"] == "Report"


def test_outside_a_trace_and_inside_scope_disable_nothing_is_recorded():
    logtree.log_text("no trace: ignored")
    with logtree.scope_header("ignored"):
        logtree.table_from_dict({"a": 1})
    with logtree.init_trace("T") as trace:
        with logtree.scope_disable():
            logtree.log_text("hidden")
            with logtree.scope_header("hidden too"):
                logtree.log_text("hidden")
        with logtree.optional_enable_logging(False):
            logtree.log_text("hidden")
        with logtree.optional_enable_logging(True):
            logtree.log_text("shown")
    body = trace.body_html()
    assert "hidden" not in body and "shown" in body


def test_concurrent_tasks_write_into_the_scope_open_when_they_started():
    async def worker(name: str, delay: float) -> None:
        with logtree.scope_header(name):
            await asyncio.sleep(delay)
            logtree.log_text(f"{name} done")

    async def main() -> logtree.Trace:
        with logtree.init_trace("T") as trace:
            await asyncio.gather(worker("slow", 0.02), worker("fast", 0.0))
        return trace

    trace = run(main())
    sections = [c for c in trace.root.children if isinstance(c, logtree.Node) and c.tag == "section"]
    texts = [re.findall(r"(\w+) done", s.to_html()) for s in sections]
    assert texts == [["slow"], ["fast"]]  # each line in its own task's section, though "fast" finished first


def run(coro):
    return asyncio.run(coro)


def test_tables_details_and_decorator():
    @logtree.scope_header_decorator
    def step() -> int:
        logtree.table([{"x": 1, "y": 2.5}, {"x": 3, "y": 4}], caption="rows")
        logtree.table([[1, 2], [3, 4]])
        logtree.table_from_dict({"b": 2, "a": 1}, sort_by="key")
        logtree.table_from_dict_of_lists({"n": [1, 2], "s": ["p", "q"]}, order=["s", "n"])
        logtree.details("long\ntext", summary="more")
        return 7

    @logtree.scope_header_decorator("Async step")
    async def astep() -> str:
        return "ok"

    with logtree.init_trace("T") as trace:
        assert step() == 7 and run_in_new_loop(astep()) == "ok"
        with pytest.raises(TypeError, match="table_from_dict"):
            logtree.table({"a": 1})
        with pytest.raises(ValueError, match="equal length"):
            logtree.table_from_dict_of_lists({"a": [1], "b": [1, 2]})
    body = trace.body_html()
    assert (2, "step") in _headings(body)
    assert "<th>x</th>" in body and "<td>2.5</td>" in body and '<div class="lt-table-caption">rows</div>' in body
    assert body.index("<td>a</td>") < body.index("<td>b</td>")  # sorted by key
    assert re.search(r"<th>s</th>\s*<th>n</th>", body)
    assert "<summary>more</summary>" in body and "long\ntext" in body


def run_in_new_loop(coro):
    # The decorated coroutine runs in a fresh loop; contextvars are copied into it, so it still logs.
    return asyncio.run(coro)


def test_formatter_css_is_added_once_and_json_keeps_structured_data(tmp_path):
    messages = [{"role": "user", "content": "Hi <there>"}, {"role": "assistant", "content": "Hello"}]
    with logtree.init_trace("T") as trace:
        logtree.log_formatter(ConversationFormatter(messages=messages))
        logtree.log_formatter(ConversationFormatter(messages=messages[:1]))
    head = trace.head_html()
    assert head.count(".lt-conversation {") == 1
    assert "Hi &lt;there&gt;" in trace.body_html() and "lt-message-assistant" in trace.body_html()
    logtree.write_trace_json(trace, tmp_path / "t.json")
    data = json.loads((tmp_path / "t.json").read_text())
    formatted = [c for c in data["root"]["children"] if "data" in c]
    assert formatted[0]["data"] == {"type": "conversation", "messages": messages}
    assert formatted[0]["children"] == []  # the raw HTML is left out where data stands for it


def test_an_exception_is_recorded_and_the_partial_page_written(tmp_path):
    path = tmp_path / "r.html"
    with pytest.raises(RuntimeError), logtree.init_trace("T", path=path):
        logtree.log_text("before")
        raise RuntimeError("boom")
    page = path.read_text()
    assert "before" in page and "Exception: RuntimeError: boom" in page


def test_flush_writes_before_the_end(tmp_path):
    path = tmp_path / "r.html"
    assert not logtree.flush_trace()
    with logtree.init_trace("T", path=path):
        logtree.log_text("early")
        assert logtree.flush_trace() and "early" in path.read_text()
        logtree.log_text("late")
    assert "late" in path.read_text()


def test_a_detached_recording_is_inserted_into_a_report_later():
    with logtree.detached_trace() as recording:  # no trace active outside: logging is on inside anyway
        logtree.log_formatter(ConversationFormatter(messages=[{"role": "user", "content": "q"}]))
        with logtree.scope_header("inner"):
            logtree.log_text("recorded")
    assert not logtree.logging_enabled()
    with logtree.init_trace("T") as trace:
        with logtree.scope_header("Outer"):
            logtree.log_trace(recording, title="Recorded")
    body = trace.body_html()
    assert "recorded" in body and ".lt-conversation {" in trace.head_html()
    assert (3, "Recorded") in _headings(body)


def test_attributes_and_raw_html():
    with logtree.init_trace("T") as trace:
        with logtree.scope_div(class_="grading", data__step="3"):
            logtree.log_html("<b>bold</b>", div_class="raw")
    body = trace.body_html()
    assert '<div class="grading" data-step="3">' in body and '<div class="raw"><b>bold</b></div>' in body
