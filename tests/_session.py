"""Identity of this pytest session's Docker objects.

One module (not ``conftest``: two conftest files exist, and ``import conftest`` would pick whichever
was imported first) that fixtures and tests share, so every object a session creates carries the
same labels and is removed at the end of that session only.
"""

from __future__ import annotations

import uuid

from stackforge.edges import docker_engine

#: Marks objects created by the test suite (value "1"); tests remove everything carrying it.
TEST_LABEL = f"{docker_engine.LABEL_PREFIX}.test"
#: Value of TEST_SESSION_LABEL: unique to this pytest session.
SESSION_ID = uuid.uuid4().hex[:12]
TEST_SESSION_LABEL = f"{TEST_LABEL}.session"


def session_labels() -> dict[str, str]:
    """The labels every image and container of this session carries."""
    return {TEST_LABEL: "1", TEST_SESSION_LABEL: SESSION_ID}
