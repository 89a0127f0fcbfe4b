"""The one schema-envelope check every stackforge JSON reader uses."""

from __future__ import annotations

from typing import Any

import pytest

from stackforge.core.envelope import check_envelope
from stackforge.core.errors import RecordError


def _check(data: Any) -> int:
    return check_envelope(data, schema="stackforge.thing", supported=2, what="thing", path="t.json",
                          make_one="make one with `stackforge thing`")


def test_a_supported_version_is_returned() -> None:
    assert _check({"schema": "stackforge.thing", "schema_version": 1}) == 1
    assert _check({"schema": "stackforge.thing", "schema_version": 2}) == 2


@pytest.mark.parametrize("data", [[], "x", None, {"schema": "stackforge.other", "schema_version": 1}, {}])
def test_another_kind_of_document_is_refused_with_how_to_make_one(data: Any) -> None:
    with pytest.raises(RecordError) as caught:
        _check(data)
    assert caught.value.path == "t.json"
    assert "not a stackforge thing (missing schema 'stackforge.thing'); make one with" in str(caught.value)


@pytest.mark.parametrize("version", [None, "1", 1.0, True, 0, -1])
def test_a_version_that_is_not_a_positive_integer_is_refused(version: Any) -> None:
    with pytest.raises(RecordError, match="thing schema_version .* is not a positive integer"):
        _check({"schema": "stackforge.thing", "schema_version": version})


def test_a_newer_version_is_refused_with_upgrade_as_remedy() -> None:
    with pytest.raises(RecordError) as caught:
        _check({"schema": "stackforge.thing", "schema_version": 3})
    assert "thing schema_version 3 is newer than this stackforge understands (2)" in str(caught.value)
    assert caught.value.remedy == "upgrade stackforge"
