"""Sharded probe runs, merged, give the same matrix as one unsharded run (issue: scale-out).

Real probe scripts run locally (``probe --local``: this environment, under its own identity, for the
targets of a small matrix), once unsharded and once as shards 1/3, 2/3, 3/3 in three working folders; the
merged shards must yield exactly the unsharded matrix (statuses and evidence of every cell).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from click.testing import CliRunner

from stackforge.cli import cli

MATRIX = """\
schema: 1
targets: [rtx-pro-6000-x8-pcie]
defaults: {python: "3.11", flavour: wheels, os: debian12, cuda: "13.1"}
include:
  - {torch: "2.14.1", flashinfer: "0.7.2", sglang: "0.5.23"}
  - {torch: "2.13.0", flashinfer: "0.6.17", sglang: "0.5.18"}
  - {torch: "2.13.0", flashinfer: "0.6.18", sglang: "0.5.20"}
  - {torch: "2.11.0", flashinfer: "0.6.12", sglang: "0.5.15.post1"}
"""


def invoke(*args: str) -> str:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.stdout


def probe(matrix: Path, results: Path, *extra: str) -> None:
    invoke("probe", "--matrix", str(matrix), "--local", "--python", sys.executable, "--feature", "torch-kernels",
           "--feature", "kernel-arch-coverage", "--results", str(results), "--timeout", "120", *extra)


VARYING = {"run_id", "created_at", "duration_s", "host", "log", "runs"}


def without_varying(value):
    """Run ids, times and durations differ between runs by design; statuses and evidence must not."""
    if isinstance(value, dict):
        return {k: without_varying(v) for k, v in value.items() if k not in VARYING}
    if isinstance(value, list):
        return [without_varying(v) for v in value]
    return value


def cells(matrix: Path, results: Path) -> list:
    payload = json.loads(invoke("matrix", "--results", str(results), "--matrix", str(matrix), "--format", "json"))
    assert payload["rows"], payload
    return sorted(json.dumps(without_varying(r), sort_keys=True) for r in payload["rows"])


def test_merged_shards_equal_the_unsharded_matrix(tmp_path):
    matrix = tmp_path / "m.yaml"
    matrix.write_text(MATRIX)
    probe(matrix, tmp_path / "full")
    for k in (1, 2, 3):
        probe(matrix, tmp_path / f"shard{k}", "--shard", f"{k}/3")
    shard_runs = [str(run) for k in (1, 2, 3) for run in (tmp_path / f"shard{k}").iterdir() if run.is_dir()]
    invoke("results", "merge", *shard_runs, "--out", str(tmp_path / "merged"))
    records = lambda root: sorted(p.relative_to(next(root.iterdir())).as_posix()  # noqa: E731
                                  for p in next(root.iterdir()).glob("*/*/*.json"))
    assert records(tmp_path / "merged") == records(tmp_path / "full")
    # --local probes the environment itself, recorded under its own identity (never a matrix stack's): once per
    # target and probe, in every shard alike, so the merge holds exactly the unsharded run's 2 records.
    assert len(records(tmp_path / "full")) == 2
    assert all(path.startswith("local-") for path in records(tmp_path / "full"))
    assert cells(matrix, tmp_path / "merged") == cells(matrix, tmp_path / "full")
