"""The matrix, the dead-end list and the pick agree with each other and with the records.

Checked twice: on the seed records built in code, and on records of real probe runs (the gate
probe scripts of stackforge/probes/scripts run in this machine's Python through
the job runner with the probe kind, ``tests/_probe_runs.run_locally``, written to a results folder and loaded back).
"""

from __future__ import annotations

import concurrent.futures
import itertools
import json
import sys
from pathlib import Path

import pytest
from matrix_fixtures import TARGET, plan_dict, seed_records

from stackforge.core.errors import NothingQualifiesError
from stackforge.core.model import Interconnect, Target
from stackforge.core.records import ResultRecord, Status
from stackforge.plan.features import load_feature_catalog
from stackforge.plan.planner import Plan
from stackforge.report.compat_matrix import CellSource, CellStatus, build_matrix, cell_judges, decide_cell
from stackforge.report.compat_matrix_write import write_matrix_json
from stackforge.report.deadends import find_dead_ends
from stackforge.report.pick import pick
from stackforge.results.store import load_results, start_run, write_record

SCRIPTS = Path(__file__).resolve().parents[1] / "stackforge" / "probes" / "scripts"
# The gate probes that exist today and the feature each decides (FEATURES of stackforge.plan.rules).
GATE_PROBES = (("torch_arch.py", "torch-kernels"), ("nvcc_codegen.py", "nvcc-codegen"),
               ("flashinfer_gates.py", "flashinfer-jit"))


def assert_consistent(records: list[ResultRecord], plan: Plan, target: str) -> None:
    """Every invariant that ties records, matrix, dead ends and pick together."""
    report = build_matrix(records, plan, target)
    mine = [r for r in records if r.target == target]
    _matrix_reflects_records(report, mine, plan)
    _dead_ends_are_exactly_the_dead_cells(report)
    _picks_never_take_a_dead_or_unmeasured_feature(report, records, plan, target)


def _matrix_reflects_records(report, records, plan) -> None:
    placed = [r for _, cell in report.cells() for r in cell.records]
    assert sorted(r.key for r in placed) == sorted(r.key for r in records)          # each record, exactly once
    json_rows = {row["stack_id"]: row for row in json.loads(write_matrix_json(report))["rows"]}
    judges = cell_judges(report.features, plan.target(report.target), load_feature_catalog())
    for row, cell in report.cells():
        mine = [r for r in records if r.stack_id == row.stack_id and r.feature == cell.feature]
        again = decide_cell(cell.feature, mine, cell.prediction, row.pruned_by, judge=judges[cell.feature])
        assert (again.status, again.source, again.tier) == (cell.status, cell.source, cell.tier)
        informative = [r for r in mine if r.outcome.status is not Status.SKIP]
        measured = cell.source is CellSource.MEASURED and cell.status is not CellStatus.SKIP
        assert measured == bool(informative)
        json_cell = next(c for c in json_rows[row.stack_id]["cells"] if c["feature"] == cell.feature)
        assert (json_cell["status"], json_cell["source"]) == (cell.status.value, cell.source.value)


def _dead_ends_are_exactly_the_dead_cells(report) -> None:
    dead = find_dead_ends(report)
    listed = {(d.feature, e.stack_id): e.status for d in dead.dead_ends for e in d.dead_on}
    dead_cells = {(cell.feature, row.stack_id): cell.status.value for row, cell in report.cells() if cell.dead}
    assert listed == dead_cells
    order = [row.stack_id for row in report.rows]
    for entry in dead.dead_ends:
        unblock = entry.unblocked_by
        if unblock is not None and unblock.basis == "measured":
            cell = report.row(unblock.stack_id).cell(entry.feature)
            assert cell.status is CellStatus.PASS and cell.source is CellSource.MEASURED
            earlier = order[:order.index(unblock.stack_id)]
            assert not any(report.row(s).cell(entry.feature).status is CellStatus.PASS
                           and report.row(s).cell(entry.feature).source is CellSource.MEASURED
                           for s in earlier)
        if unblock is None:
            assert not any(row.cell(entry.feature).status is CellStatus.PASS for row in report.rows)


def _picks_never_take_a_dead_or_unmeasured_feature(report, records, plan, target) -> None:
    dead = {(d.feature, e.stack_id) for d in find_dead_ends(report).dead_ends for e in d.dead_on}
    requirements = [()] + [tuple(c) for n in (1, 2) for c in itertools.combinations(report.features, n)]
    for require, driver in itertools.product(requirements, (None, "999.1", "1.0")):
        try:
            chosen = pick(records, plan, target, list(require), driver=driver).picked()
        except NothingQualifiesError:
            assert not any(_qualifies_by_hand(report, row, require, driver) for row in report.rows), (require, driver)
            continue
        row = report.row(chosen.candidate.stack_id)
        assert row.plan_status != "pruned"
        for feature in require:
            cell = row.cell(feature)
            assert (feature, row.stack_id) not in dead
            assert cell.source is CellSource.MEASURED and cell.status is CellStatus.PASS
        gate_only = any(row.cell(f).tier.value == "gate" for f in require)
        assert chosen.exit_code == (5 if gate_only else 0)
        assert chosen.reference and any(chosen.reference.endswith(r.provenance.digest or r.provenance.image_id or "")
                                        for r in row.records)


def _qualifies_by_hand(report, row, require, driver) -> bool:
    """An independent statement of the qualification rule (for the 'nothing qualifies' direction)."""
    if row.plan_status == "pruned" or not any(r.provenance.image or r.provenance.image_id for r in row.records):
        return False
    if driver == "1.0" and ((row.derived or {}).get("min_driver") or report.target_info.get("min_driver")):
        return False
    return all(row.cell(f).source is CellSource.MEASURED and row.cell(f).status is CellStatus.PASS
               for f in require)


def test_seed_records_are_consistent():
    assert_consistent(seed_records(), Plan.from_json(plan_dict()), TARGET)


def test_seed_records_without_a_plan_are_consistent():
    assert_consistent(seed_records(), Plan.empty(), TARGET)


# ---------------------------------------------------------------------------------------------- real probe runs


def _real_probe_records(tmp_path: Path, stacks, targets) -> list[ResultRecord]:
    from _probe_runs import ProbeContext, run_locally

    from stackforge.edges.gpus import HostGpus
    from stackforge.probes.catalog import ProbeSpec

    specs = [ProbeSpec(id=script.removesuffix(".py").replace("_", "-"), feature=feature, tier="gate", script=script,
                       description=f"{script} as a gate probe", default_timeout_s=180)
             for script, feature in GATE_PROBES if (SCRIPTS / script).is_file()]
    if not specs:
        pytest.skip(f"no gate probe scripts in {SCRIPTS}")
    host = HostGpus(False, "test host: no GPU used")
    run_dir = start_run(tmp_path, command=["pytest", "real probes"], run_id="real-probes")
    jobs = [(stack, spec, target) for stack in stacks for spec in specs for target in targets]

    def one(job):
        stack, spec, target = job
        ctx = ProbeContext(run_id=run_dir.name, target=target, host_gpus=host)
        record = run_locally(stack, spec, ctx, python=sys.executable)
        write_record(run_dir, record)
        return record

    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(one, jobs))
    loaded = load_results(run_dir)
    assert loaded.problems == ()
    assert len(loaded.records) == len(jobs)
    return list(loaded.records)


@pytest.mark.heavy
def test_real_probe_runs_are_consistent(tmp_path):
    """Real gate probes for the default matrix's kept stacks, on sm_120 and on a V100 (sm_70) profile."""
    from stackforge.core.data import default_matrix_path
    from stackforge.plan.planner import Plan, plan_file

    plan_obj = plan_file(default_matrix_path())
    plan = Plan.from_json(json.loads(json.dumps(plan_obj.to_json())))
    rtx = next(c.target for c in plan_obj.cells)
    # A user-added profile the shipped toolkit dropped (CUDA 13 nvcc has no sm_70): a real dead end.
    v100 = Target(name="v100-x8-nvlink", gpu="Tesla V100", arch="7.0", gpu_count=8, interconnect=Interconnect.NVLINK)
    stacks = plan_obj.kept_stacks()[:2]
    records = _real_probe_records(tmp_path, stacks, (rtx, v100))
    statuses = {r.outcome.status for r in records}
    assert statuses <= set(Status) and all(r.outcome.reason for r in records)
    assert_consistent(records, plan, rtx.name)
    assert_consistent(records, Plan.empty(), v100.name)
    nvcc = [r for r in records if r.feature == "nvcc-codegen" and r.target == v100.name]
    if nvcc and nvcc[0].outcome.status is Status.FAIL:
        dead = find_dead_ends(build_matrix(records, Plan.empty(), v100.name))
        entry = next(d for d in dead.dead_ends if d.feature == "nvcc-codegen")
        assert "sm_70" in entry.headline.evidence                    # the compiler's own words
