"""Golden test: the generated nightly workflow for a fixed, feature-rich configuration."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from stackforge.ci.github import WorkflowConfig, write_workflow

GOLDEN = Path(__file__).resolve().parent / "workflows" / "stackforge-nightly.yml"

# Two GPU arch labels, a non-GHCR registry (secret-based login) and three shards: every branch of the
# generator shows up in this one file. The install spec is explicit (a tag of the git repository) so a
# version bump changes nothing.
GOLDEN_CONFIG = WorkflowConfig(matrix="matrices/default.yaml", gpu_labels=("sm_120", "sm_90"),
                               registry="registry.example.com/ml/stackforge", shards=3,
                               install="git+https://github.com/acme/stackforge@v0.1.0")


def test_nightly_workflow_matches_golden_file(check_golden: Callable[[Path, str], None]) -> None:
    check_golden(GOLDEN, write_workflow(GOLDEN_CONFIG))
