"""Property of the watch's proposed patches: a bound moved one release restores itself.

For every shipped rule with a wheel witness and a version bound, and for each of its bounds, the bound is
moved one release earlier and one release later in a git copy of ``compat/``. The watch then replays the
release where both the moved and the measured bound are on the index (the later of the two), with the
releases up to it, as :func:`stackforge.watch.campaign._recheck_rules` does. The proposed patch must be a
diff ``git apply`` takes, never an empty or inverted range (the rule linter), and must restore exactly the
measured bound; the patched copy must verify CONFIRMED.

Stub readings: a release reads what the shipped rule expects inside exactly when the shipped rule covers
it (the shipped bounds are the measured ones); the releases are PyPI's real lists, frozen in
tests/data/watch_release_lists.json, so pre- and post-releases sit where they really do.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from packaging.specifiers import Specifier, SpecifierSet

from stackforge.core.data import data_dir
from stackforge.core.versions import parse_version
from stackforge.core.wheel_readings import CodeSite, Reading, ReadingStatus
from stackforge.plan.rule_lint import lint_rules
from stackforge.plan.rules import Rule, load_rules, load_targets
from stackforge.watch.campaign import rules_to_recheck
from stackforge.watch.patches import propose_patch
from stackforge.wheels.verify import WitnessResult, verify_rules

RELEASES = {dist: sorted(versions, key=parse_version) for dist, versions in
            json.loads((Path(__file__).parent / "data" / "watch_release_lists.json").read_text()).items()
            if not dist.startswith("_")}
TARGETS = load_targets()


def _bound_cases() -> list[tuple[str, str, int]]:
    """(rule id, bound as written, direction) for every bound of every witnessed rule that its witness
    reads: a bound at the edge of the witness's ``over`` (the releases it looks at) is not read, and a
    bound with no release one step away on the index cannot be moved there."""
    cases = []
    for rule in load_rules():
        witness = rule.witness
        if witness is None or witness.dist not in RELEASES:
            continue
        conditions = [c for c in rule.conditions if c.fact == witness.version_fact]
        if len(conditions) != 1 or conditions[0].op != "spec":
            continue
        for spec in conditions[0].operand:
            assert spec.operator in (">=", "<"), f"{rule.id}: extend the property to {spec.operator}"
            for step in (-1, 1):
                moved = _moved(RELEASES[witness.dist], spec, step)
                if moved is not None and all(witness.over is None or witness.over.contains(v, prereleases=True)
                                             for v in moved):
                    cases.append((rule.id, str(spec), step))
    return cases


def _moved(releases: list[str], spec: Specifier, step: int) -> tuple[str, str] | None:
    """The measured bound's release (the first the bound lets in or keeps out) and the release one
    ``step`` away; None when the index has no such release."""
    measured = next((v for v in releases if parse_version(v) >= parse_version(spec.version)), None)
    if measured is None or not 0 <= releases.index(measured) + step < len(releases):
        return None
    return measured, releases[releases.index(measured) + step]


CASES = _bound_cases()


def _stub(shipped: Rule):
    """Readings that agree with the shipped rule: inside its range, what it expects inside."""
    witness = shipped.witness
    assert witness is not None
    conditions = [c for c in shipped.conditions if c.fact == witness.version_fact]
    inside_status = witness.inside[0]
    outside_status = next(s for s in (ReadingStatus.AVAILABLE, ReadingStatus.UNAVAILABLE, ReadingStatus.ABSENT)
                          if s not in witness.inside or witness.shows)

    def evaluate(fact, dist, version, ctx):
        inside = all(c.holds(version) for c in conditions)
        code = f"{witness.shows} gate" if inside and witness.shows else "other code"
        status = inside_status if inside else outside_status
        return Reading(fact, status, f"{fact} {status.value} in {version}: {code}",
                       (CodeSite("pkg/gate.py", 42, code),))
    return evaluate


def _git(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=False)


@pytest.fixture(scope="module")
def shipped_rules():
    return {rule.id: rule for rule in load_rules()}


def test_every_witnessed_rule_has_bounds_to_move():
    # The property below must run over real rules, not an empty list.
    assert len({case[0] for case in CASES}) >= 15 and len(CASES) >= 40


@pytest.mark.parametrize(("rule_id", "bound", "step"), CASES, ids=[f"{r}:{b}:{s:+d}" for r, b, s in CASES])
def test_a_bound_moved_one_release_is_restored_by_the_proposed_patch(tmp_path, shipped_rules, rule_id, bound, step):
    shipped = shipped_rules[rule_id]
    evaluate = _stub(shipped)
    assert_restored(tmp_path, shipped, bound, step, RELEASES[shipped.witness.dist], lambda seen: (evaluate, seen))


def assert_restored(tmp_path: Path, shipped: Rule, bound: str, step: int, releases: list[str], readings) -> None:
    """Move ``bound`` of ``shipped`` one release ``step`` in a git copy of compat/, replay the release at the
    boundary, apply the proposed patch with git and check it restores the measured bound, CONFIRMED.

    ``readings(seen)`` gives the evaluator and the release list for the releases ``seen`` (oldest first)."""
    rule_id, witness = shipped.id, shipped.witness
    spec = Specifier(bound)
    measured, moved_to = _moved(releases, spec, step)

    # A git copy of compat/ with the bound moved one release.
    root = tmp_path / "repo"
    shutil.copytree(data_dir("compat"), root / "compat")
    assert _git(root, "init", "-q").returncode == 0
    relative, _, line = shipped.origin.rpartition(":")
    rule_file = root / relative
    lines = rule_file.read_text().splitlines(keepends=True)
    start = int(line) - 1
    at = next(i for i in range(start, len(lines)) if lines[i].lstrip().startswith(f"{witness.version_fact}:"))
    assert f'"{bound}' in lines[at] or f',{bound}' in lines[at], lines[at]
    lines[at] = lines[at].replace(bound, f"{spec.operator}{moved_to}", 1)
    rule_file.write_text("".join(lines))
    mutated = replace(next(r for r in load_rules([rule_file]) if r.id == rule_id), origin=shipped.origin)

    # The watch replays the later of the two releases, with the releases up to it.
    replayed = max(measured, moved_to, key=parse_version)
    seen = releases[:releases.index(replayed) + 1]
    assert mutated in rules_to_recheck([mutated], witness.dist, replayed, seen), "the watch would not recheck it"
    evaluate, listed = readings(seen)
    (check,) = verify_rules([mutated], TARGETS, evaluate=evaluate, list_releases=lambda dist: listed).rules
    assert check.result is WitnessResult.WRONG, check.why
    patch = propose_patch(mutated, check, replayed, rule_file.read_text())
    assert patch is not None and patch.diff, patch.summary if patch else "no patch"

    # git apply takes it; the patched rule holds exactly the measured bound and is no empty range.
    (root / "fix.diff").write_text(patch.diff)
    applied = _git(root, "apply", "--check", "fix.diff")
    assert applied.returncode == 0, applied.stderr
    assert _git(root, "apply", "fix.diff").returncode == 0
    patched = next(r for r in load_rules([rule_file]) if r.id == rule_id)
    (condition,) = [c for c in patched.conditions if c.fact == witness.version_fact]
    shipped_condition = next(c for c in shipped.conditions if c.fact == witness.version_fact)
    expected = SpecifierSet(",".join(f"{s.operator}{measured}" if str(s) == bound else str(s)
                                     for s in shipped_condition.operand))
    assert condition.operand == expected, f"{condition.operand} != {expected}"
    assert not lint_rules([patched]), [p.text for p in lint_rules([patched])]
    evaluate, listed = readings(releases)
    (verified,) = verify_rules([patched], TARGETS, evaluate=evaluate, list_releases=lambda dist: listed).rules
    assert verified.result is WitnessResult.CONFIRMED, verified.why


# The same property on the real index and wheels, for a sample: one SGLang and one FlashInfer bound, each
# moved both ways (every bound would read hundreds of wheels; the sample keeps .ci/run within its budget).
PYPI_SAMPLE = [("sglang-ar-fusion-rejects-sm12", ">=0.5.14", -1), ("sglang-ar-fusion-rejects-sm12", ">=0.5.14", 1),
               ("flashinfer-sm120-needs-cuda129-nvcc", "<0.7.1", -1),
               ("flashinfer-sm120-needs-cuda129-nvcc", "<0.7.1", 1)]


@pytest.mark.pypi
@pytest.mark.parametrize(("rule_id", "bound", "step"), PYPI_SAMPLE, ids=[f"{r}:{b}:{s:+d}" for r, b, s in PYPI_SAMPLE])
def test_a_bound_moved_one_release_is_restored_from_the_real_wheels(tmp_path, monkeypatch, shipped_rules, rule_id,
                                                                      bound, step):
    from stackforge.edges.index import IndexRequest, configured_indexes, release_listing
    from stackforge.wheels.cache import WheelCache
    from stackforge.wheels.readings import WheelReadings

    repo = Path(__file__).resolve().parents[1]
    monkeypatch.setenv("STACKFORGE_WHEEL_CACHE", os.environ.get("STACKFORGE_WHEEL_CACHE")
                       or str(repo / ".cache" / "wheels"))
    shipped = shipped_rules[rule_id]
    indexes = configured_indexes(IndexRequest())
    cache = WheelCache.open(indexes)
    listing = release_listing(shipped.witness.dist, indexes=indexes, include_yanked=True, session=cache.session)
    found = [r for r in listing.releases if not r.yanked]

    def readings(seen: list[str]):
        # As the watch reads: only the releases up to the one replayed are on its list.
        usable = [r for r in found if r.version in set(seen)]
        wheel_readings = WheelReadings(indexes=indexes, cache=cache, found={shipped.witness.dist: usable})
        return wheel_readings.evaluate, wheel_readings.list_releases(shipped.witness.dist)

    assert_restored(tmp_path, shipped, bound, step, [r.version for r in found], readings)
