"""Golden-file support: ``--update-golden`` rewrites golden files instead of comparing with them.

pytest only honours ``pytest_addoption`` from conftest files it loads at start-up (the root
``tests/conftest.py``, or this folder when ``tests/golden`` is named on the command line). So
``pytest tests/golden --update-golden`` always works; for ``pytest --update-golden`` from the
repository root, the option must also be declared in ``tests/conftest.py``. Declaring it twice is
harmless: the second declaration is skipped below.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

GOLDEN_DIR = Path(__file__).resolve().parent


def pytest_addoption(parser: pytest.Parser) -> None:
    try:
        parser.addoption("--update-golden", action="store_true", default=False,
                         help="Rewrite golden files from the current output instead of comparing.")
    except ValueError:
        pass  # already declared by tests/conftest.py


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    """True when the run was asked to rewrite golden files (``--update-golden``)."""
    return bool(request.config.getoption("--update-golden", default=False))


@pytest.fixture
def check_golden(update_golden: bool) -> Callable[[Path, str], None]:
    """A function ``check(path, actual)``: compare with the golden file, or rewrite it under --update-golden.

    A missing golden file fails (with the hint to create it), so a typo in a path never passes.
    """
    def check(path: Path, actual: str) -> None:
        if update_golden:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(actual, encoding="utf-8")
            return
        if not path.is_file():
            pytest.fail(f"golden file {path} is missing; create it with: pytest tests/golden --update-golden")
        expected = path.read_text(encoding="utf-8")
        assert actual == expected, (f"output differs from golden file {path}; if the change is intended, "
                                    "regenerate with: pytest tests/golden --update-golden and review the diff")

    return check
