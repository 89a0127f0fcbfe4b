"""The envelope every stackforge JSON document carries: ``schema`` (what it is) and ``schema_version``.

Readers check the envelope before any field, with :func:`check_envelope`, so that a file of another
kind, or one written by a newer stackforge, is refused with one line naming the file, instead of
being half-read.

The two layouts JSON is written in live here too: a stored document (:func:`document_text`) and a
printed report or ``--json`` answer (:func:`report_json_text`).
"""

from __future__ import annotations

import json
from typing import Any

from stackforge.core.errors import RecordError

__all__ = ["check_envelope", "document_text", "report_json_text"]


def check_envelope(data: Any, *, schema: str, supported: int, what: str, path: str = "",
                   make_one: str = "") -> int:
    """The ``schema_version`` of ``data``, once its envelope says it is a ``schema`` document this
    stackforge reads.

    Args:
        data: the parsed JSON document.
        schema: the ``schema`` value the document must carry (``stackforge.plan``).
        supported: the newest ``schema_version`` this stackforge understands.
        what: the document's name in messages (``plan``, ``build record``).
        path: where the document came from, for the message.
        make_one: how to produce such a document, appended to the "not a ..." message.

    Raises:
        RecordError: not a mapping carrying ``schema``; a ``schema_version`` that is not a positive
            integer; or one newer than ``supported`` (remedy: upgrade stackforge).
    """
    if not isinstance(data, dict) or data.get("schema") != schema:
        hint = f"; {make_one}" if make_one else ""
        raise RecordError(f"not a stackforge {what} (missing schema {schema!r}){hint}", path=path)
    version = data.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise RecordError(f"{what} schema_version {version!r} is not a positive integer", path=path)
    if version > supported:
        raise RecordError(f"{what} schema_version {version} is newer than this stackforge understands "
                          f"({supported})", path=path, remedy="upgrade stackforge")
    return version


def document_text(data: dict[str, Any]) -> str:
    """How a stored JSON document is written: sorted keys, two-space indent, a final newline. Two writes
    of one document are then byte-identical, and two runs' files diff line by line."""
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def report_json_text(data: dict[str, Any]) -> str:
    """How a report or a command's answer is printed as JSON: keys in the order they were built (the
    order a reader meets them), two-space indent, non-ASCII text as it is, a final newline."""
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"
