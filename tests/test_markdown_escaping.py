"""Markdown reports escape HTML and neutralize javascript:/data:/vbscript: links from record and rule text,
as the HTML reports do (one function: stackforge/core/markdown.py md_text): matrix, upgrade, dead ends,
diff and the watch report."""

from __future__ import annotations

import re

import pytest
from matrix_fixtures import CU128, CU131, TARGET, plan_dict, record, seed_records

from stackforge.core.wheel_readings import CodeSite, Reading, ReadingStatus
from stackforge.plan.planner import Plan
from stackforge.report.compat_matrix import build_matrix
from stackforge.report.compat_matrix_write import write_matrix_md
from stackforge.report.deadends import find_dead_ends, write_deadends
from stackforge.report.diff import diff_snapshots, snapshot_from_records, write_diff
from stackforge.report.formats import write_upgrade
from stackforge.core.markdown import md_document, md_text
from stackforge.report.upgrade import StackChoice, build_upgrade
from stackforge.watch.campaign import NewRelease, ReadingComparison, WatchReport
from stackforge.watch.report import report_markdown
from stackforge.wheels.tier import Measurement

HOSTILE = ("<script>alert(1)</script> <img src=x onerror=alert(1)> [a](javascript:alert(1)) "
           "[b](data:text/html;base64,PHNjcmlwdD4=) [c]( VBScript:msgbox(1)) [[d]](javascript:alert(2))")


def assert_inert(text: str) -> None:
    """No raw tag from the record and no dangerous link target, in any markdown syntax."""
    assert not re.search(r"<\s*/?\s*(script|img|iframe|svg|a)\b", text, re.IGNORECASE), text
    assert "onerror=alert(1)>" not in text
    assert not re.search(r"\]\(\s*<?\s*(javascript|data|vbscript)", text, re.IGNORECASE), text   # a link
    assert not re.search(r"^\s{0,3}\[[^\]]*\]:\s*<?\s*(javascript|data|vbscript)", text, re.I | re.M), text
    assert not re.search(r"\b(javascript|vbscript|data)\s*:", text, re.IGNORECASE), text   # nor the scheme


def hostile_records():
    return seed_records() + [
        record(CU128, "flashinfer-jit", "fail", tier="runtime", reason=HOSTILE, evidence=HOSTILE),
        record(CU131, "flashinfer-jit", "fail", tier="runtime", reason=HOSTILE, evidence=HOSTILE,
               run_id="20260302T020000Z-bbbbbb", created_at="2026-03-02T02:00:00+00:00"),
    ]


def hostile_plan():
    plan = plan_dict()
    for cell in plan["cells"]:
        for prediction in cell["predictions"]:
            if prediction.get("rule"):
                prediction["reason"] = HOSTILE
                prediction["sources"] = [{"ref": "evil <b>", "url": "javascript:alert(1)",
                                          "confidence": "verified"}]
    return Plan.from_json(plan)


@pytest.mark.parametrize("text, shown", [
    ("<script>alert(1)</script>", "&lt;script&gt;alert(1)&lt;/script&gt;"),
    ("<img src=x onerror=alert(1)>", "&lt;img src=x onerror=alert(1)&gt;"),
    ("[a](javascript:alert(1))", "a (javascript&#58;alert(1))"),
    ("a & b >= 1", "a &amp; b &gt;= 1"),
    ("`<b>` and `ok`", "&lt;b&gt; and `ok`"),                     # a span that would show entities: text
    ("metadata:python [x](https://example.org)", "metadata:python [x](https://example.org)"),
])
def test_md_text_escapes_tags_and_dangerous_links_only(text, shown):
    assert md_text(text) == shown


def test_the_matrix_markdown_is_inert():
    report = build_matrix(hostile_records(), hostile_plan(), TARGET)
    text = write_matrix_md(report)
    assert_inert(text)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text        # shown, not dropped


def test_the_dead_ends_markdown_is_inert_folded_and_unfolded():
    dead = find_dead_ends(build_matrix(hostile_records(), hostile_plan(), TARGET))
    for text in (write_deadends(dead, "md"), write_deadends(dead, "text", evidence=True)):
        assert_inert(text)
        assert "&lt;img src=x onerror=alert(1)&gt;" in text
    assert "<details><summary>evidence</summary>" in write_deadends(dead, "md")   # the writer's folding stays


def test_the_upgrade_markdown_is_inert():
    report = build_upgrade(hostile_records(), hostile_plan(), TARGET, StackChoice(cuda="12.8"),
                           StackChoice(cuda="13.1"))
    text = write_upgrade(report, "md")
    assert_inert(text)
    assert "&lt;script&gt;" in text


def test_the_diff_markdown_is_inert():
    before = [record(CU128, "flashinfer-jit", "pass", tier="gate", reason="ok")]
    after = [record(CU128, "flashinfer-jit", "fail", tier="gate", reason=HOSTILE, run_id="b")]
    diff = diff_snapshots(snapshot_from_records(before, "a"), snapshot_from_records(after, "b<i>"))
    text = write_diff(diff, "md")
    assert_inert(text)
    assert "&lt;script&gt;" in text and "b&lt;i&gt;" in text


def test_the_watch_markdown_is_inert_and_keeps_its_folding():
    def measured(version: str, status: ReadingStatus) -> Measurement:
        reading = Reading("flashinfer-jit", status, HOSTILE, (CodeSite("pkg/<x>.py", 3, HOSTILE),))
        return Measurement("flashinfer-python", version, reading, None)

    release = NewRelease("flashinfer-python", "0.7.2", "2026-03-01T00:00:00Z", "0.7.1",
                         comparisons=(ReadingComparison("flashinfer-jit", TARGET, (),
                                                        measured("0.7.1", ReadingStatus.AVAILABLE),
                                                        measured("0.7.2", ReadingStatus.UNAVAILABLE)),))
    unread = NewRelease("sglang", "0.5.30", "now", None, unread=HOSTILE)
    report = WatchReport(checked_at="now", index="https://pypi.org/simple", matrix="m.yaml",
                         targets=(TARGET,), baseline={}, newest={}, releases=(release, unread), notes=(HOSTILE,))
    text = report_markdown(report)
    assert_inert(text)
    assert "<details><summary>flashinfer-jit on" in text and "</details>" in text
    assert "<pre>" in text and "&lt;script&gt;alert(1)&lt;/script&gt;" in text   # the code, shown as written


def test_md_document_keeps_a_language_fence_and_the_writers_tags():
    # A blank line after </details>, as the writers put it: markdown's HTML block ends there, the fence opens.
    doc = "<details><summary>x <b></summary>\n\n```\n<script>\n```\n</details>\n\n```diff\n-a <b>\n```"
    assert md_document(doc) == ("<details><summary>x &lt;b&gt;</summary>\n\n<pre>\n&lt;script&gt;\n</pre>\n"
                                "</details>\n\n```diff\n-a <b>\n```")
