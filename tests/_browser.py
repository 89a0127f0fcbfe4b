"""Headless Chromium for the HTML pages' browser tests (matrix, upgrade): the one launcher both use.

Needs Debian's ``chromium`` package (the CI script installs it); :func:`require_chromium` skips with
that reason when /usr/bin/chromium is absent. Chromium runs through the runner (the one subprocess
choke point).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from stackforge.edges import runner

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"


def require_chromium() -> None:
    if not CHROMIUM.exists():
        pytest.skip("needs headless Chromium at /usr/bin/chromium (apt-get install -y chromium)")


def chromium(tmp_path: Path, *args: str) -> str:
    """Run headless Chromium with a profile under ``tmp_path``; its output."""
    argv = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run",
            f"--user-data-dir={tmp_path / 'profile'}", *args]
    result = runner.run(argv, timeout=120, tail_chars=2_000_000)
    assert result.succeeded, f"chromium {result.describe()}: {result.output_tail[-2000:]}"
    return result.output_tail


def dump_dom(tmp_path: Path, url: str, *, width: int | None = None) -> str:
    """The page's DOM after its scripts ran (in a window ``width`` pixels wide when given)."""
    size = (f"--window-size={width},900",) if width else ()
    output = chromium(tmp_path, *size, "--dump-dom", url)
    start = output.find("<html")
    assert start >= 0, output[-2000:]
    return output[start:]


#: Characters that need a colour-emoji font (empty boxes without one): pictographs, dingbats, variation
#: selector 16, fullwidth forms.
EMOJI = re.compile("[\U0001F000-\U0001FAFF\u2600-\u27BF\uFE0F\u2B00-\u2BFF\u2300-\u23FF\uFF00-\uFFEF]")


def laid_out_width(dom: str) -> int:
    """The width the page laid out to (its script writes it on <body data-width>)."""
    match = re.search(r'<body[^>]*data-width="(\d+)"', dom)
    assert match, "the page's script did not record its width"
    return int(match.group(1))
