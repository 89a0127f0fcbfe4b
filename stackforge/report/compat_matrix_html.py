"""The matrix as one self-contained HTML file: inline CSS and JS, no network, sortable and filterable.

Every cell shows its glyph and how it was decided; its reason, evidence, rule sources and every
record behind it are in a ``<details>`` (one click) and in the cell's ``title`` (hover).
The page reads ``?filter=...&sort=<column>&dir=asc|desc`` (or the same after ``#``) on load and
keeps the filter in the address bar, so a filtered view can be linked. A Content-Security-Policy
forbids every network load: the file works offline and leaks nothing when opened.

A page holds at most :data:`MAX_HTML_ROWS` stack rows (kept stacks first, then pruned ones, each in
matrix order); the rest are counted in a last row that says how to see them (``--format csv`` or
``json``, or a narrower ``--plan``). Each row carries every cell's evidence, ~35 KB a row: 10^4 rows made a 352 MB page.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from string import Template

from stackforge.core.records import ResultRecord
from stackforge.plan.rules import Finding
from stackforge.report.compat_matrix import (
    CONTRADICTED_GLYPH,
    GLYPHS,
    HOW_LABELS,
    LEGEND,
    CellSource,
    CellStatus,
    MatrixReport,
    ReportCell,
    ReportRow,
    cell_summary,
    header_summary,
    image_display,
    one_line,
    row_driver_floor,
    source_text,
    target_text,
)

__all__ = ["MAX_HTML_ROWS", "css_name", "write_matrix_html", "row_filter_js"]

#: The most stack rows one HTML page holds (docs/matrix-format.md); the others are counted, not drawn.
MAX_HTML_ROWS = 500

# Sort rank of a status in its column: working first, dead last (ties broken by the key metric).
_RANK = {CellStatus.PASS: 0, CellStatus.BUILT: 1, CellStatus.ADMITTED: 2, CellStatus.REQUIRES: 3,
         CellStatus.HAZARD: 4, CellStatus.SKIP: 5, CellStatus.UNDECIDED: 6, CellStatus.UNTESTED: 7,
         CellStatus.NOT_APPLICABLE: 8, CellStatus.ERROR: 9, CellStatus.UNAVAILABLE: 10, CellStatus.FAIL: 11,
         CellStatus.TIMEOUT: 12, CellStatus.CRASH: 13, CellStatus.PRUNED: 14}

def css_name(status: str) -> str:
    """A status or change as a CSS class name part (``n/a`` -> ``na``: a slash would need escaping in selectors)."""
    return str(getattr(status, "value", status)).replace("/", "")


# No network, ever: styles and scripts are inline, and nothing else may load.
_CSP = ("<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
        "style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:\">")

_CSS = """
:root { --fg:#1b1f24; --muted:#57606a; --line:#d0d7de; --bg:#fff; --head:#f6f8fa; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--fg);
       background: var(--bg); margin: 20px; }
h1 { font-size: 20px; margin: 0 0 4px; }
.meta { color: var(--muted); margin: 2px 0; }
.controls { margin: 12px 0; display: flex; gap: 16px; align-items: center; flex-wrap: wrap; }
#filter { font-size: 14px; padding: 5px 8px; width: 360px; border: 1px solid var(--line);
          border-radius: 6px; }
.legend { display: flex; flex-wrap: wrap; gap: 6px 14px; margin: 8px 0 14px; color: var(--muted);
          font-size: 13px; }
.legend span { overflow-wrap: anywhere; }
table { border-collapse: collapse; }
th, td { border: 1px solid var(--line); padding: 4px 6px; vertical-align: top; text-align: left; }
thead th { background: var(--head); position: sticky; top: 0; cursor: pointer; user-select: none;
           white-space: nowrap; z-index: 1; }
thead th[aria-sort="ascending"]::after { content: " ▲"; }
thead th[aria-sort="descending"]::after { content: " ▼"; }
tbody th { font-weight: normal; background: #fcfcfd; min-width: 230px; max-width: 380px; }
.stack-meta code { word-break: break-all; }
.stack-id { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 12.5px;
            font-weight: 600; }
.stack-meta { color: var(--muted); font-size: 12px; }
td.cell { min-width: 92px; max-width: 340px; }
summary { cursor: pointer; white-space: nowrap; list-style: none; }
summary::-webkit-details-marker { display: none; }
.how { color: var(--muted); font-size: 12px; }
.metric { font-variant-numeric: tabular-nums; font-size: 12px; }
.ev { font-size: 12px; margin-top: 4px; white-space: normal; }
.ev pre { white-space: pre-wrap; word-break: break-word; background: #f6f8fa; padding: 4px; margin: 3px 0;
          max-height: 220px; overflow: auto; font-size: 11.5px; }
.st-pass { background: #e8f6ec; } .st-built { background: #ecf7ef; } .st-admitted { background: #f1f8f3; }
.st-na { background: #fafafa; color: #999; } .st-fail, .st-crash, .st-timeout { background: #fdecec; }
.st-unavailable { background: #fbeff2; } .st-hazard, .st-requires { background: #fff8e5; }
.st-error { background: #f3eefc; } .st-skip, .st-untested, .st-undecided { background: #f6f8fa; color: var(--muted); }
.st-pruned { background: #eeeeee; color: #777; }
td.src-predicted summary { font-style: italic; }
td.contradicted { outline: 2px dashed #cf222e; outline-offset: -3px; }
tr.pruned th .stack-id { text-decoration: line-through; color: #777; }
table.fold-pruned tbody tr.pruned { display: none; }
tfoot td { background: #fafafa; color: var(--muted); }
#toggle-pruned { font: inherit; cursor: pointer; border: 1px solid var(--line); border-radius: 6px;
                 background: #fff; padding: 2px 8px; }
.scroll { max-width: 100%; overflow-x: auto; }
h1, p, li, summary { overflow-wrap: anywhere; }
svg.mark { vertical-align: -1px; }
.warn { color: #cf222e; font-weight: 600; }
.notes { margin-top: 18px; color: var(--muted); font-size: 12.5px; max-width: 1100px; }
"""

_ROW_FILTER_JS = Template("""\
    var terms = input.value.toLowerCase().split(/\\s+/).filter(Boolean);
    var rows = $rows, visible = 0;
    for (var i = 0; i < rows.length; i++) {
      var hay = rows[i].getAttribute('data-search');
      var ok = terms.every(function (t) { return hay.indexOf(t) !== -1; });
      rows[i].hidden = !ok;
      if (ok) visible++;
    }
    shown.textContent = visible + ' of ' + rows.length + ' $noun shown';
""")


def row_filter_js(rows: str, noun: str) -> str:
    """The body of a page's filter function, for this page and the upgrade page.

    It hides every row of ``rows`` (a JavaScript expression) whose ``data-search`` text lacks one of
    the whitespace-separated terms typed in ``input``, and writes "N of M <noun> shown" into
    ``shown``; the script must have ``input`` and ``shown`` in scope.
    """
    return _ROW_FILTER_JS.substitute(rows=rows, noun=noun)


# Sorting and filtering. The filter matches every whitespace-separated term against the row's
# search text (stack id, versions, "feature=status" pairs, reasons), so "flashinfer-jit=fail cu131"
# finds the rows where that feature fails on CUDA 13.1 stacks.
_JS = """
(function () {
  var table = document.getElementById('matrix');
  var body = table.tBodies[0];
  var input = document.getElementById('filter');
  var shown = document.getElementById('shown');
  function params() {
    var text = location.search.replace(/^\\?/, '') || location.hash.replace(/^#/, '');
    return new URLSearchParams(text);
  }
  function applyFilter() {
""" + row_filter_js("body.rows", "stacks") + """\
    table.setAttribute('data-filter', input.value);
  }
  function sortBy(col, dir) {
    var heads = table.tHead.rows[0].cells;
    for (var h = 0; h < heads.length; h++) heads[h].removeAttribute('aria-sort');
    var head = heads[col];
    head.setAttribute('aria-sort', dir === 'desc' ? 'descending' : 'ascending');
    var sign = dir === 'desc' ? -1 : 1;
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (a, b) {
      var x = a.cells[col], y = b.cells[col];
      var d = parseFloat(x.getAttribute('data-rank')) - parseFloat(y.getAttribute('data-rank'));
      if (d === 0) d = parseFloat(y.getAttribute('data-metric')) - parseFloat(x.getAttribute('data-metric'));
      if (d === 0) d = parseFloat(a.getAttribute('data-order')) - parseFloat(b.getAttribute('data-order'));
      return sign * d;
    });
    rows.forEach(function (r) { body.appendChild(r); });
    table.setAttribute('data-sorted', head.getAttribute('data-key') + ':' + (dir || 'asc'));
  }
  function remember() {
    try { history.replaceState(null, '', '#filter=' + encodeURIComponent(input.value)); } catch (e) {}
  }
  var heads = table.tHead.rows[0].cells;
  for (var i = 0; i < heads.length; i++) {
    heads[i].addEventListener('click', (function (col) {
      return function () {
        var now = heads[col].getAttribute('aria-sort');
        sortBy(col, now === 'ascending' ? 'desc' : 'asc');
      };
    })(i));
  }
  input.addEventListener('input', function () { applyFilter(); remember(); });
  var toggle = document.getElementById('toggle-pruned');
  function showPruned(show) {
    table.classList.toggle('fold-pruned', !show);
    if (toggle) toggle.textContent = toggle.textContent.replace(show ? /folded: show them/ : /shown: fold them/,
                                                                show ? 'shown: fold them' : 'folded: show them');
  }
  if (toggle) toggle.addEventListener('click', function () {
    showPruned(table.classList.contains('fold-pruned'));
  });
  var p = params();
  if (p.get('pruned') === 'show') showPruned(true);
  if (p.get('filter')) input.value = p.get('filter');
  if (p.get('sort')) {
    for (var k = 0; k < heads.length; k++) {
      if (heads[k].getAttribute('data-key') === p.get('sort')) sortBy(k, p.get('dir') || 'asc');
    }
  }
  applyFilter();
  // How wide the page lays out (tests check it fits a 1280 px window).
  document.body.setAttribute('data-width', String(document.documentElement.scrollWidth));
})();
"""


# Status marks drawn as inline SVG: they render the same in every browser, with no emoji font installed
# (headless Chromium on Debian shows colour emoji as empty boxes). Shape and colour carry the status; the
# status word always follows the mark.
_SHAPES = {
    "pass": '<circle cx="6" cy="6" r="5" fill="#1a7f37"/>',
    "admitted": '<circle cx="6" cy="6" r="4" fill="none" stroke="#1a7f37" stroke-width="2"/>',
    "built": '<circle cx="6" cy="6" r="4" fill="none" stroke="#1a7f37" stroke-width="2"/>'
             '<circle cx="6" cy="6" r="1.8" fill="#1a7f37"/>',
    "fail": '<path d="M2 2L10 10M10 2L2 10" stroke="#cf222e" stroke-width="2.4"/>',
    "crash": '<path d="M6 0L7.5 4.5L12 6L7.5 7.5L6 12L4.5 7.5L0 6L4.5 4.5Z" fill="#cf222e"/>',
    "timeout": '<path d="M2 1H10L2 11H10Z" fill="none" stroke="#bc4c00" stroke-width="1.6"/>',
    "error": '<rect x="1.5" y="1.5" width="9" height="9" fill="#8250df"/>',
    "skip": '<path d="M2 2L7 6L2 10ZM7 2L12 6L7 10Z" fill="#8c959f"/>',
    "undecided": '<circle cx="6" cy="6" r="4" fill="none" stroke="#8c959f" stroke-width="2" stroke-dasharray="2 2"/>',
    "unavailable": '<circle cx="6" cy="6" r="4.5" fill="none" stroke="#cf222e" stroke-width="1.6"/>'
                   '<path d="M3 9L9 3" stroke="#cf222e" stroke-width="1.6"/>',
    "hazard": '<path d="M6 1L11.5 11H0.5Z" fill="#d4a72c"/>',
    "requires": '<rect x="2" y="2" width="8" height="8" fill="none" stroke="#0969da" stroke-width="2"/>',
    "pruned": '<rect x="1" y="4.5" width="10" height="3" fill="#6e7781"/>',
    "untested": '<circle cx="6" cy="6" r="1.8" fill="#8c959f"/>',
    "n/a": '<path d="M2 10L10 2" stroke="#afb8c1" stroke-width="1.6"/>',
    "contradicted": '<path d="M4 1V8M8 1V8" stroke="#cf222e" stroke-width="2"/><circle cx="4" cy="10.5" r="1" '
                    'fill="#cf222e"/><circle cx="8" cy="10.5" r="1" fill="#cf222e"/>',
}


def marked(text: str) -> str:
    """``text`` escaped for HTML, with the report's status glyphs drawn as marks (:func:`status_mark`)."""
    html = escape(text)
    glyphs = {CONTRADICTED_GLYPH: "contradicted", **{glyph: status.value for status, glyph in GLYPHS.items()}}
    for glyph, status in glyphs.items():
        html = html.replace(escape(glyph), status_mark(status))
    return html


def status_mark(status: str) -> str:
    """The inline SVG mark of a status (``pass``, ``fail``... or ``contradicted``), with its name as the title."""
    shape = _SHAPES.get(status, _SHAPES["untested"])
    return (f'<svg class="mark" width="12" height="12" viewBox="0 0 12 12" role="img" aria-label="{escape(status)}">'
            f"<title>{escape(status)}</title>{shape}</svg>")


def write_matrix_html(report: MatrixReport) -> str:
    """The whole report as one HTML document (UTF-8 text)."""
    title = f"stackforge matrix · {report.target}"
    return "\n".join([
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        _CSP,
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{escape(title)}</title>",
        f"<style>{_CSS}</style></head><body>",
        _header(report),
        _controls(report),
        _legend(),
        _table(report),
        _notes(),
        f"<script>{_JS}</script>",
        "</body></html>",
        "",
    ])


def _header(report: MatrixReport) -> str:
    lines = [f"<header><h1>stackforge matrix · {escape(target_text(report))}</h1>"]
    if report.matrix_name:
        lines.append(f'<p class="meta">matrix <b>{escape(report.matrix_name)}</b> '
                     f"({escape(report.matrix_source)})</p>")
    if report.runs:
        lines.append(f'<p class="meta">runs: {escape(", ".join(report.runs))}</p>')
    lines.append(f'<p class="meta">{marked(header_summary(report))}</p></header>')
    return "\n".join(lines)


def _controls(report: MatrixReport) -> str:
    drawn = len(_drawn_rows(report.rows))
    return ('<div class="controls"><label>Filter <input id="filter" type="search" autocomplete="off" '
            'placeholder="stack, version, feature=status, reason…"></label>'
            f'<span id="shown">{drawn} of {drawn} stacks shown</span>'
            '<span class="meta">Click a column header to sort; click a cell for its evidence.</span></div>')


def _legend() -> str:
    items = [f'<span class="st-{css_name(s)}">{status_mark(s.value)} {escape(s.value)}: '
             f'{escape(LEGEND[s.value])}</span>' for s in CellStatus]
    items.append(f'<span>{status_mark("contradicted")} {escape(LEGEND["contradicted"])}</span>')
    items.append("<span><i>gate</i> = inside the image, no GPU · <i>run</i> = runtime probe on the GPU · "
                 "<i>bench</i> = benchmark · <i>rule</i> = predicted, not measured</span>")
    return '<section class="legend" id="legend">' + "".join(items) + "</section>"


def _table(report: MatrixReport) -> str:
    heads = ['<th data-key="stack" scope="col">stack</th>']
    heads += [f'<th data-key="{escape(f)}" scope="col">{escape(f)}</th>' for f in report.features]
    target_min = report.target_info.get("min_driver")
    drawn = _drawn_rows(report.rows)
    rows = [_row(row, index, report.target, target_min) for index, row in enumerate(drawn)]
    pruned = sum(row.plan_status == "pruned" for row in drawn)
    # The pruned stacks are folded under one row by default: the kept ones are the answer.
    fold = (f'<tr><td colspan="{len(heads)}"><button type="button" id="toggle-pruned">'
            f'{pruned} pruned stack(s) folded: show them</button></td></tr>' if pruned else "")
    left_out = _left_out(report.rows, drawn, len(heads))
    foot = f"<tfoot>{fold}{left_out}</tfoot>" if fold or left_out else ""
    return ('<div class="scroll"><table id="matrix" class="fold-pruned"><thead><tr>' + "".join(heads)
            + "</tr></thead><tbody>\n" + "\n".join(rows) + "\n</tbody>" + foot + "</table></div>")


def _drawn_rows(rows: Sequence[ReportRow]) -> list[ReportRow]:
    """The rows one page draws: up to :data:`MAX_HTML_ROWS`, kept stacks before pruned ones (the kept ones
    are the answer), each group in matrix order."""
    if len(rows) <= MAX_HTML_ROWS:
        return list(rows)
    kept = [row for row in rows if row.plan_status != "pruned"]
    return (kept + [row for row in rows if row.plan_status == "pruned"])[:MAX_HTML_ROWS]


def _left_out(rows: Sequence[ReportRow], drawn: Sequence[ReportRow], columns: int) -> str:
    """A last row counting the stacks past the page's cap, and how to see them; "" when every row is drawn."""
    if len(drawn) == len(rows):
        return ""
    missing = len(rows) - len(drawn)
    pruned = sum(row.plan_status == "pruned" for row in rows) - sum(row.plan_status == "pruned" for row in drawn)
    return (f'<tr id="rows-left-out"><td colspan="{columns}">+{missing:,} more rows ({pruned:,} of them pruned) '
            f"not drawn: a page holds {MAX_HTML_ROWS:,}. <code>--format csv</code> or <code>--format json</code> "
            f"has every row; or narrow the plan (<code>stackforge plan --only ... --json &gt; plan.json</code>, "
            f"then <code>--plan plan.json</code>).</td></tr>")


def _row(row: ReportRow, index: int, target: str, target_min: str | None) -> str:
    values = [str(v) for v in row.stack.values() if isinstance(v, (str, int, float)) and v != ""]
    reasons = dict.fromkeys(c.reason for c in row.cells if c.reason)      # a pruned row repeats one reason
    search = " ".join([row.stack_id, row.plan_status, *values,
                       *(f"{c.feature}={c.status.value} {c.how}" for c in row.cells), *reasons]).lower()
    cells = "".join(_cell(cell) for cell in row.cells)
    return (f'<tr class="{escape(row.plan_status)}" data-order="{index}" data-search="{escape(search)}">'
            f'<th scope="row" data-rank="{index}" data-metric="0">{_stack_head(row, target, target_min)}</th>{cells}</tr>')


def _stack_head(row: ReportRow, target: str, target_min: str | None) -> str:
    stack = row.stack
    versions = " · ".join(f"{k} {stack[k]}" for k in ("cuda", "torch", "flashinfer", "sglang", "python")
                          if stack.get(k))
    extra = [f"flavour {stack['flavour']}"] if stack.get("flavour") else []
    floor = row_driver_floor(row, target, target_min) if row.driver_floor is not None else None
    if floor is not None and floor.version:
        # The same floor as `plan` and `pick --driver` (not the toolkit's bundled driver).
        extra.append(f"driver ≥ {floor.version}")
    parts = [f'<span class="stack-id">{escape(row.stack_id)}</span>',
             f'<div class="stack-meta">{escape(versions)}</div>']
    if extra:
        parts.append(f'<div class="stack-meta">{escape(" · ".join(extra))}</div>')
    if row.plan_status == "pruned":
        parts.append(_pruned_details(row))
    elif row.plan_status == "unplanned":
        what = "external image, probed as it is" if row.stack.get("external") else "measured, not in the plan"
        parts.append(f'<div class="stack-meta">{what}</div>')
    for image in row.images():
        # Digests are long: show the start, keep the whole reference in the hover text.
        shown = image if len(image) <= 64 else image[:61] + "…"
        parts.append(f'<div class="stack-meta" title="{escape(image)}">image '
                     f"<code>{escape(shown)}</code></div>")
    return "".join(parts)


def _pruned_details(row: ReportRow) -> str:
    items = "".join(f"<li><b>{escape(f.rule.id)}</b>: {escape(f.rule.reason)}{_rule_sources(f)}</li>"
                    for f in row.pruned_by)
    return f'<details><summary>{status_mark("pruned")} pruned</summary><ul class="ev">{items}</ul></details>'


def _cell(cell: ReportCell) -> str:
    classes = ["cell", f"st-{css_name(cell.status)}", f"src-{cell.source.value}"]
    if cell.contradicted:
        classes.append("contradicted")
    metric = cell.metric.value if cell.metric is not None else 0
    label = _label(cell)
    body = _evidence(cell)
    content = f"<details><summary>{label}</summary>{body}</details>" if body else label
    return (f'<td class="{" ".join(classes)}" data-status="{cell.status.value}" '
            f'data-source="{cell.source.value}" data-rank="{_RANK[cell.status]}" data-metric="{metric}" '
            f'title="{escape(cell_summary(cell))}">{content}</td>')


def _label(cell: ReportCell) -> str:
    """Glyph, status word, how it was decided, key metric: readable without colour or emoji fonts."""
    glyph = (status_mark("contradicted") if cell.contradicted else "") + status_mark(cell.status.value)
    parts = [f'<span class="glyph">{glyph}</span> <b>{escape(cell.status.value)}</b>']
    if cell.how and cell.status is not CellStatus.PRUNED:
        parts.append(f'<span class="how">{escape(HOW_LABELS[cell.how])}</span>')
    if cell.metric is not None:
        parts.append(f'<span class="metric">{escape(cell.metric.text())}</span>')
    return " ".join(parts)


def _evidence(cell: ReportCell) -> str:
    parts = []
    if cell.contradicted:
        parts.append(f'<p class="warn">{status_mark("contradicted")} {escape(cell.contradicted)}</p>')
    if cell.unpredicted:
        parts.append('<p class="warn">No rule predicts this failure: a compat rule is missing.</p>')
    if cell.undecided:
        parts.append(f"<p>{status_mark('undecided')} {escape(cell.undecided)}</p>")
    # Measurements first: they decide the cell; the rule's prediction follows for comparison.
    parts.extend(_record_html(record) for record in cell.records)
    if cell.source is CellSource.PREDICTED or cell.prediction is not None and cell.prediction.rule:
        parts.append(_prediction_html(cell))
    if not parts and cell.reason:
        parts.append(f"<p>{escape(cell.reason)}</p>")
    return f'<div class="ev">{"".join(parts)}</div>' if parts else ""


def _prediction_html(cell: ReportCell) -> str:
    if cell.status is CellStatus.PRUNED:
        return "".join(f"<p>{status_mark('pruned')} pruned by rule <b>{escape(f.rule.id)}</b>: {escape(f.rule.reason)}"
                       f"{_rule_sources(f)}</p>" for f in cell.pruned_by)
    prediction = cell.prediction
    if prediction is None or not prediction.rule:
        return ""
    text = (f"<p>rule <b>{escape(prediction.rule)}</b> predicts <b>{escape(prediction.verdict.value)}</b>: "
            f"{escape(prediction.reason)}</p>")
    if prediction.error:
        text += f'<p class="how">the error users meet:</p><pre>{escape(prediction.error)}</pre>'
    if prediction.remedy:
        text += f"<p>remedy: {escape(prediction.remedy)}</p>"
    return text + _sources(prediction.sources)


def _record_html(record: ResultRecord) -> str:
    outcome = record.outcome
    shown = image_display(record)
    head = (f"<p><b>{escape(record.tier.value)}</b> probe <code>{escape(record.probe)}</code>: "
            f"<b>{escape(outcome.status.value)}</b> — {escape(outcome.reason)} "
            f'<span class="how">({outcome.duration_s:.1f} s, run {escape(record.run_id)})</span></p>')
    lines = [head]
    if outcome.evidence:
        lines.append(f"<pre>{escape(outcome.evidence)}</pre>")
    if outcome.metrics:
        lines.append(f'<p class="metric">{escape(one_line(_metrics_text(outcome.metrics), 600))}</p>')
    if shown:
        lines.append(f'<p class="how">image <code>{escape(shown)}</code></p>')
    return "".join(lines)


def _metrics_text(metrics: Mapping[str, object]) -> str:
    return ", ".join(f"{name}={value}" for name, value in sorted(metrics.items()))


def _rule_sources(finding: Finding) -> str:
    return _sources([s.to_json() for s in finding.rule.sources])


def _sources(sources: Sequence[Mapping[str, str]]) -> str:
    if not sources:
        return ""
    items = []
    for source in sources:
        label = escape(source_text(source))
        url = source.get("url", "")
        # Only plain web links: a javascript: URL in a rule file must not become a clickable script.
        if url.startswith(("https://", "http://")):
            items.append(f'<a href="{escape(url)}" rel="noopener noreferrer">{label}</a>')
        else:
            items.append(label)
    return f'<p class="how">sources: {", ".join(items)}</p>'


def _notes() -> str:
    return ('<p class="notes">A measured result always wins over a prediction; where they disagree both are '
            "shown and the cell is outlined. Runtime and bench results outrank gate results; within a tier "
            "the worst outcome decides. Generated by stackforge; this file loads nothing from the "
            "network.</p>")


#: The page's style and network policy, for other stackforge pages in the same look (``upgrade``).
PAGE_CSS = _CSS
PAGE_CSP = _CSP
