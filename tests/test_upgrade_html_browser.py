"""The HTML upgrade report in a real browser (headless Chromium): what a person sees, and the filter works.

Needs Debian's ``chromium`` package (``apt-get install -y chromium``; the CI script installs it);
skipped with that reason when /usr/bin/chromium is absent, as the matrix page's browser test. The
screenshot is kept as a test artifact under ``tests/artifacts/`` (git-ignored).
"""

from __future__ import annotations

import html
import re
from pathlib import Path
from urllib.parse import quote

import pytest
from _browser import ARTIFACTS, EMOJI, chromium, dump_dom, laid_out_width, require_chromium
from matrix_fixtures import CU128, CU131, TARGET, plan_dict, seed_records

from stackforge.plan.planner import Plan
from stackforge.report.upgrade import StackChoice, build_upgrade
from stackforge.report.upgrade_html import write_upgrade_html

pytestmark = pytest.mark.browser



@pytest.fixture(scope="module")
def page(tmp_path_factory) -> Path:
    require_chromium()
    path = tmp_path_factory.mktemp("html") / "upgrade.html"
    # The CUDA 12.8 side has no measurement: its column must say "predicted only".
    records = [r for r in seed_records() if r.stack_id != CU128]
    report = build_upgrade(records, Plan.from_json(plan_dict()), TARGET, StackChoice(cuda="12.8"),
                           StackChoice(cuda="13.1"), runs=("20260301T020000Z-aaaaaa",))
    path.write_text(write_upgrade_html(report), encoding="utf-8")
    return path


def visible_features(dom: str) -> list[str]:
    """Feature names of the features table rows the page shows, in display order."""
    rows = re.findall(r'<tr class="ch-[a-z]+" data-search="([^"]*)"( hidden="")?>', dom)
    return [search.split()[0] for search, hidden in rows if not hidden]


def text_of(dom: str) -> str:
    """The page's words, as a person reads them (entities decoded)."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", dom)).split())


def test_what_a_person_sees(page, tmp_path):
    dom = dump_dom(tmp_path, page.as_uri())
    text = text_of(dom)
    assert "stackforge upgrade · CUDA 12.8 → 13.1 on rtx-pro-6000-x8-pcie" in text
    assert f"from {CU128} (predicted only)" in text and f"to {CU131}" in text
    assert "6 of 6 features shown" in dom
    assert visible_features(dom) == ["flashinfer-ar-fusion", "custom-allreduce", "torch-symm-mem",
                                     "flashinfer-jit", "nccl-graph-tree", "serve"]
    for phrase in ("gained", "unavailable predicted by rule fi-arfusion-sm120", "pass measured (runtime)",
                   "driver floor >= 570.26", ">= 590.44.01", "Dead ends that remain after the upgrade",
                   "none: never probed on this target"):
        assert phrase in text, phrase
    # the deciding evidence is one click away
    assert "RuntimeError: SymmetricMemory is not supported on this device (sm_120)" in dom


def test_filter_from_the_address_bar(page, tmp_path):
    dom = dump_dom(tmp_path, page.as_uri() + "?filter=" + quote("gained"))
    assert visible_features(dom) == ["flashinfer-ar-fusion"]
    assert "1 of 6 features shown" in dom
    dom = dump_dom(tmp_path, page.as_uri() + "#filter=" + quote("to=pass undecided"))
    assert visible_features(dom) == ["flashinfer-jit", "serve"]


def test_screenshot_is_kept_as_an_artifact(page, tmp_path):
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "upgrade_html.png"
    shot.unlink(missing_ok=True)
    chromium(tmp_path, f"--screenshot={shot}", "--window-size=1400,1000", page.as_uri())
    data = shot.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 20_000      # a rendered page, not a blank one


def test_marks_need_no_emoji_font_and_the_page_fits_1280_pixels(page, tmp_path):
    dom = dump_dom(tmp_path, page.as_uri(), width=1280)
    assert not EMOJI.findall(dom), sorted(set(EMOJI.findall(dom)))
    assert '<svg class="mark"' in dom
    assert laid_out_width(dom) <= 1280


#: Appended to a copy of the page (its CSP allows inline scripts): every cell of the features table whose
#: laid-out text reaches past the cell's own box, i.e. over the next column.
OVERFLOW_CHECK = """<script>
(function () {
  var over = [];
  document.querySelectorAll('#features tbody tr').forEach(function (row) {
    Array.prototype.forEach.call(row.children, function (cell, column) {
      var box = cell.getBoundingClientRect(), range = document.createRange();
      range.selectNodeContents(cell);
      var text = range.getBoundingClientRect();
      if (text.width && (text.right > box.right + 1 || text.left < box.left - 1)) {
        over.push(row.querySelector('code').textContent + ' column ' + column + ': text to ' + Math.round(text.right)
                  + ' px, cell to ' + Math.round(box.right) + ' px');
      }
    });
  });
  document.body.setAttribute('data-overflow', over.join('; ') || 'none');
})();
</script>"""


def test_long_change_text_stays_in_its_column_at_1280_pixels(tmp_path):
    """An admitted feature whose two sides rest on evidence of different strength says so in its change
    text ("admitted (evidence of different strength: from ..., to ...)"): it wraps inside its column."""
    import dataclasses

    from stackforge.report.upgrade import ChangeKind, FeatureChange, SideCell

    require_chromium()
    records = [r for r in seed_records() if r.stack_id != CU128]
    report = build_upgrade(records, Plan.from_json(plan_dict()), TARGET, StackChoice(cuda="12.8"),
                           StackChoice(cuda="13.1"), runs=("20260301T020000Z-aaaaaa",))
    rule = "fi-nvfp4-gemm-sm120-runtime-failure-reported-for-flashinfer-0.6.3"
    long = FeatureChange("nvfp4-gemm", ChangeKind.ADMITTED,
                         SideCell("unavailable", f"predicted by rule {rule}", "a run-time failure reported", "",
                                  rule=rule, level=f"predicted by rule {rule}"),
                         SideCell("admitted", "measured (wheel)", "mm_fp4 admits capability 120 in four backends", "",
                                  level="measured (wheel)"))
    assert len(long.label()) > 150, long.label()          # the text that ran over the next column
    page = tmp_path / "upgrade-long.html"
    html_text = write_upgrade_html(dataclasses.replace(report, features=(long, *report.features)))
    page.write_text(html_text.replace("</body>", OVERFLOW_CHECK + "</body>"), encoding="utf-8")
    dom = dump_dom(tmp_path, page.as_uri(), width=1280)
    overflow = re.search(r'data-overflow="([^"]*)"', dom)
    assert overflow, "the check script did not run"
    assert html.unescape(overflow.group(1)) == "none"
    assert "nvfp4-gemm" in visible_features(dom)
    assert laid_out_width(dom) <= 1280
