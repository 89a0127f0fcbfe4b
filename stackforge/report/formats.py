"""Each report as text of one format: the compatibility matrix (md, html, json, csv) and the upgrade
report (md, json, html).

The dispatch lives here, above the modules that write each format, so that the HTML pages can
import the reports' types without the reports importing the pages back.
"""

from __future__ import annotations

from stackforge.core.envelope import report_json_text
from stackforge.core.errors import SpecError
from stackforge.report import compat_matrix, compat_matrix_write, upgrade
from stackforge.report.compat_matrix_html import write_matrix_html
from stackforge.report.upgrade_html import write_upgrade_html


def write_matrix(report: compat_matrix.MatrixReport, fmt: str, *, evidence: bool = False) -> str:
    """``report`` as ``text`` (one screen; ``evidence``: the markdown, everything), ``md``, ``html``, ``json``
    or ``csv``.

    Raises:
        SpecError: an unknown format.
    """
    if fmt == "text" and evidence:
        return compat_matrix_write.write_matrix_md(report)
    writers = {"text": compat_matrix_write.write_matrix_text, "md": compat_matrix_write.write_matrix_md,
               "html": write_matrix_html, "json": compat_matrix_write.write_matrix_json,
               "csv": compat_matrix_write.write_matrix_csv}
    if fmt not in writers:
        raise SpecError(f"unknown format {fmt!r}; choose one of {', '.join(compat_matrix.FORMATS)}")
    return writers[fmt](report)


def write_upgrade(report: upgrade.UpgradeReport, fmt: str, *, evidence: bool = False) -> str:
    """``report`` as ``text`` (one screen; ``evidence``: the markdown, everything), ``md``, ``json`` or ``html``.

    Raises:
        SpecError: an unknown format.
    """
    if fmt == "text":
        return upgrade.write_upgrade_md(report) if evidence else upgrade.write_upgrade_text(report)
    if fmt == "md":
        return upgrade.write_upgrade_md(report)
    if fmt == "json":
        return report_json_text(upgrade.upgrade_to_json(report))
    if fmt == "html":
        return write_upgrade_html(report)
    raise SpecError(f"unknown format {fmt!r}; choose one of {', '.join(upgrade.FORMATS)}")
