"""``stackforge render`` and ``stackforge build``: options reach the library, results reach the exit code."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

import stackforge.build
import stackforge.edges.docker_engine
from stackforge.build import BuildRecord, BuildStatus, BuildSummary
from stackforge.cli import cli


def test_render_writes_a_context_per_kept_stack(tmp_path):
    result = CliRunner().invoke(cli, ["render", "--out", str(tmp_path), "--no-dependency-layers", "--no-lock",
                                      "--find-links", str(tmp_path), "--builder", "classic"])
    assert result.exit_code == 0, result.output
    lines = [line.split() for line in result.stdout.splitlines() if line.strip()]   # stderr: the CA line
    assert lines
    for folder, tag in lines:
        dockerfile = Path(folder) / "Dockerfile"
        assert dockerfile.is_file() and (Path(folder) / "stack.json").is_file()
        assert tag.startswith(f"stackforge/{Path(folder).name}:")
        assert "--mount" not in dockerfile.read_text()   # rendered for the classic builder
        assert "127.0.0.1:${STACKFORGE_ASSET_PORT}/wheelhouse/" in dockerfile.read_text()


def test_render_refuses_an_index_url_with_credentials(tmp_path):
    result = CliRunner().invoke(cli, ["render", "--out", str(tmp_path), "--no-dependency-layers",
                                      "--index-url", "https://me:secret@mirror.example.com/simple"])
    assert result.exit_code == 2
    assert "credentials" in result.output and "secret" not in result.output.replace("secrets", "")


def _summary(cells, statuses) -> BuildSummary:
    records = tuple(BuildRecord(stack_id=stack.id, stack=stack.to_json(), derived=derived.to_json(), status=status,
                                reason="No matching distribution found for x" if status is BuildStatus.FAILED else "")
                    for (stack, derived), status in zip(cells, statuses))
    return BuildSummary(records, builder="buildkit", duration_s=1.0)


@pytest.fixture
def captured(monkeypatch):
    """Replace the engine and the builder; keep what the CLI passed to build_stacks."""
    seen = {}

    def fake_build(cells, options, *, client, progress):
        seen.update(cells=cells, options=options, progress=progress)
        return _summary(cells, seen["statuses"](len(cells)))

    monkeypatch.setattr(stackforge.build, "build_stacks", fake_build)
    monkeypatch.setattr(stackforge.edges.docker_engine, "connect", lambda: object())
    monkeypatch.setattr(stackforge.edges.docker_engine, "reap_orphans",
                        lambda client: stackforge.edges.docker_engine.Orphans((), ()))
    return seen


def test_build_passes_options_and_exits_0_when_every_stack_is_built(captured, tmp_path):
    captured["statuses"] = lambda n: [BuildStatus.BUILT] * n
    result = CliRunner().invoke(cli, ["build", "--out", str(tmp_path), "-j", "3", "--resume", "--builder", "classic",
                                      "--no-deps", "sglang", "--label", "team=infra", "--no-progress"])
    assert result.exit_code == 0, result.output
    options = captured["options"]
    assert options.jobs == 3 and options.resume and options.builder.value == "classic"
    assert options.no_deps == frozenset({"sglang"}) and ("team", "infra") in options.labels
    assert options.out_dir == tmp_path and captured["progress"] is False
    assert "built" in result.output


def test_build_exits_1_and_names_the_failed_stacks(captured, tmp_path):
    captured["statuses"] = lambda n: [BuildStatus.FAILED] + [BuildStatus.BUILT] * (n - 1)
    result = CliRunner().invoke(cli, ["build", "--out", str(tmp_path), "--no-progress"])
    assert result.exit_code == 1
    failed_id = captured["cells"][0][0].id
    assert f"stack(s) failed: {failed_id}" in result.output and "logs/<stack-id>.<run-id>.log" in result.output


def test_build_rejects_a_malformed_label(captured, tmp_path):
    captured["statuses"] = lambda n: [BuildStatus.BUILT] * n
    result = CliRunner().invoke(cli, ["build", "--out", str(tmp_path), "--label", "novalue"])
    assert result.exit_code == 2 and "KEY=VALUE" in result.output


def _empty_and_full_shard(total: int) -> tuple[str, str]:
    """An empty and a non-empty shard K/N of the default matrix's kept stacks (the hash decides which)."""
    from stackforge.core.data import resolve_matrix_path
    from stackforge.core.shard import Shard, select
    from stackforge.plan.planner import plan_file

    kept = plan_file(resolve_matrix_path(None)).kept_stacks()
    sizes = {str(shard): len(select(kept, shard)) for shard in Shard.all_of(total)}
    return (next(s for s, n in sizes.items() if n == 0), next(s for s, n in sizes.items() if n > 0))


def test_build_on_an_empty_shard_exits_0_and_builds_nothing(captured, tmp_path):
    empty, full = _empty_and_full_shard(8)
    captured["statuses"] = lambda n: [BuildStatus.BUILT] * n
    result = CliRunner().invoke(cli, ["build", "--out", str(tmp_path), "--shard", empty, "--no-progress"])
    assert result.exit_code == 0, result.output
    assert f"shard {empty} holds none of the kept stacks: nothing to build" in result.output
    assert "cells" not in captured, "the builder must not be called for an empty shard"
    result = CliRunner().invoke(cli, ["build", "--out", str(tmp_path), "--shard", full, "--no-progress"])
    assert result.exit_code == 0 and captured["cells"], result.output


def test_build_with_no_kept_stack_at_all_still_exits_2(captured, tmp_path):
    from stackforge.core.data import resolve_matrix_path
    from stackforge.plan.planner import plan_file

    plan = plan_file(resolve_matrix_path(None))
    kept = set(plan.kept_stacks())
    pruned = next(cell.stack.id for cell in plan.cells if cell.stack not in kept)
    result = CliRunner().invoke(cli, ["build", "--out", str(tmp_path), "--only", pruned, "--shard", "1/2"])
    assert result.exit_code == 2 and "no stack to build" in result.output
