"""The HTML matrix in a real browser (headless Chromium): what a person sees, and the JS works.

Needs Debian's ``chromium`` package (``apt-get install -y chromium``; the CI script installs it);
skipped with that reason when /usr/bin/chromium is absent. The screenshots are kept as test artifacts
under ``tests/artifacts/`` (git-ignored). Status marks are inline SVG, so no emoji font is needed; the
page is checked to lay out within a 1280 px window, with the pruned stacks folded under one row.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import quote

import pytest
from _browser import ARTIFACTS, EMOJI, chromium, dump_dom, laid_out_width, require_chromium
from matrix_fixtures import CU128, CU130, CU131, PRUNED, TARGET, plan_dict, seed_records

from stackforge.plan.planner import Plan
from stackforge.report.compat_matrix import build_matrix
from stackforge.report.compat_matrix_html import write_matrix_html

pytestmark = pytest.mark.browser



@pytest.fixture(scope="module")
def page(tmp_path_factory) -> Path:
    require_chromium()
    path = tmp_path_factory.mktemp("html") / "matrix.html"
    report = build_matrix(seed_records(), Plan.from_json(plan_dict()), TARGET,
                        runs=("20260301T020000Z-aaaaaa",))
    path.write_text(write_matrix_html(report), encoding="utf-8")
    return path


def visible_rows(dom: str) -> list[str]:
    """Stack ids of the table rows the page shows, in display order."""
    rows = re.findall(r'<tr class="[a-z]+" data-order="\d+" data-search="([^"]*)"( hidden="")?>', dom)
    return [search.split()[0] for search, hidden in rows if not hidden]


def test_what_a_person_sees(page, tmp_path):
    dom = dump_dom(tmp_path, page.as_uri())
    assert 'id="filter"' in dom and 'id="legend"' in dom
    assert "4 of 4 stacks shown" in dom
    assert visible_rows(dom) == [CU128, PRUNED, CU130, CU131]                     # version order
    text = re.sub(r"<[^>]+>", " ", dom)
    for phrase in ("fail: measured: does not work", "unavailable: predicted by a rule: not available",
                   "a measurement contradicts a rule's prediction", "1 rule(s) contradicted by measurement"):
        assert phrase in " ".join(text.split())
    cell = re.search(r'<td class="cell st-pass src-measured"[^>]*data-metric="112.0"[^>]*>(.*?)</td>', dom, re.DOTALL)
    assert cell and "112 tok/s" in cell.group(1) and "bench" in cell.group(1)
    assert "No supported CUDA architectures found for major versions [12]" in dom   # evidence one click away


def test_filter_from_the_address_bar(page, tmp_path):
    dom = dump_dom(tmp_path, page.as_uri() + "?filter=" + quote("torch-symm-mem=fail"))
    assert visible_rows(dom) == [CU131]
    assert "1 of 4 stacks shown" in dom
    dom = dump_dom(tmp_path, page.as_uri() + "#filter=" + quote("cu128 kept"))
    assert visible_rows(dom) == [CU128]


def test_sort_by_a_feature_column(page, tmp_path):
    dom = dump_dom(tmp_path, page.as_uri() + "?sort=serve&dir=asc")
    # pass first (the higher throughput first), then untested, then pruned
    assert visible_rows(dom) == [CU131, CU128, CU130, PRUNED]
    assert 'data-sorted="serve:asc"' in dom and 'aria-sort="ascending"' in dom
    dom = dump_dom(tmp_path, page.as_uri() + "?sort=stack&dir=desc")
    assert visible_rows(dom) == [CU131, CU130, PRUNED, CU128]


def test_screenshot_is_kept_as_an_artifact(page, tmp_path):
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "matrix_html.png"
    shot.unlink(missing_ok=True)
    chromium(tmp_path, f"--screenshot={shot}", "--window-size=1400,900", page.as_uri())
    data = shot.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 20_000      # a rendered page, not a blank one


def test_marks_need_no_emoji_font_and_the_page_fits_1280_pixels(page, tmp_path):
    dom = dump_dom(tmp_path, page.as_uri(), width=1280)
    assert not EMOJI.findall(dom), sorted(set(EMOJI.findall(dom)))
    assert '<svg class="mark"' in dom and 'aria-label="fail"' in dom
    assert laid_out_width(dom) <= 1280
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "matrix_html_1280.png"
    chromium(tmp_path, f"--screenshot={shot}", "--window-size=1280,900", page.as_uri())
    assert shot.read_bytes().startswith(b"\x89PNG")


def test_pruned_stacks_are_folded_under_one_row(page, tmp_path):
    dom = dump_dom(tmp_path, page.as_uri())
    assert 'class="fold-pruned"' in dom and "1 pruned stack(s) folded: show them" in dom
    shown = dump_dom(tmp_path, page.as_uri() + "?pruned=show")
    assert 'id="matrix" class=""' in shown and "1 pruned stack(s) shown: fold them" in shown
