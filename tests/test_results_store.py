"""The results store: layout, atomic and concurrent writes, loading with every problem reported,
merging by key, the JSON Schema, and the record contract."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
from pathlib import Path

import pytest
from matrix_fixtures import CU128, CU131, TARGET, record, seed_records

from stackforge.build.records import BuildRecord, BuildStatus
from stackforge.build.records import write_record as write_build_record
from stackforge.core.errors import RecordError
from stackforge.core.fsio import atomic_write_text
from stackforge.core.records import RESULT_SCHEMA_VERSION, Outcome, ResultRecord
from stackforge.results.store import (
    RUN_FILE,
    RunInfo,
    finish_run,
    load_results,
    merge_records,
    merge_runs,
    read_run_info,
    record_path,
    result_schema,
    start_run,
    write_record,
)


def make_run(root: Path, records, run_id: str = "20260301T020000Z-aaaaaa") -> Path:
    run_dir = start_run(root, command=["stackforge", "probe"], matrix_source="matrices/seed.yaml",
                        shard="1/2", run_id=run_id, host="ci-1")
    for rec in records:
        write_record(run_dir, dataclasses.replace(rec, run_id=run_id))
    finish_run(run_dir)
    return run_dir


# ---------------------------------------------------------------------------------------------- layout


def test_layout_roundtrip_and_run_metadata(tmp_path):
    records = seed_records()
    run_dir = make_run(tmp_path, records)
    assert (run_dir / CU128 / TARGET / "flashinfer-jit-gate.json").is_file()
    info = read_run_info(run_dir)
    assert (info.run_id, info.host, info.shard, info.matrix_source) == (run_dir.name, "ci-1", "1/2",
                                                                        "matrices/seed.yaml")
    assert info.command == ("stackforge", "probe") and info.started_at and info.finished_at
    assert info.stackforge_version
    loaded = load_results(run_dir)
    assert loaded.problems == ()
    assert [r.key for r in loaded.records] == sorted(r.key for r in records)
    by_key = {r.key: r for r in loaded.records}
    for original in records:
        assert by_key[original.key] == dataclasses.replace(original, run_id=run_dir.name)


def test_results_root_loads_every_run_and_selects_runs(tmp_path):
    make_run(tmp_path, [record(CU128, "serve", "fail", tier="bench")], run_id="20260301T020000Z-aaaaaa")
    make_run(tmp_path, [record(CU128, "serve", "pass", tier="bench", created_at="2026-03-02T02:00:00+00:00")],
             run_id="20260302T020000Z-bbbbbb")
    everything = load_results(tmp_path)
    assert [i.run_id for i in everything.runs] == ["20260301T020000Z-aaaaaa", "20260302T020000Z-bbbbbb"]
    assert [r.outcome.status.value for r in everything.records] == ["pass"]          # newest wins
    first = load_results(tmp_path, runs=["20260301T020000Z-aaaaaa"])
    assert [r.outcome.status.value for r in first.records] == ["fail"]
    assert load_results(tmp_path, runs=["latest"]).runs[0].run_id == "20260302T020000Z-bbbbbb"
    with pytest.raises(RecordError, match="no such run: nope"):
        load_results(tmp_path, runs=["nope"])


def test_missing_or_empty_results_folder_is_an_error(tmp_path):
    with pytest.raises(RecordError, match="does not exist"):
        load_results(tmp_path / "absent")
    with pytest.raises(RecordError, match="no run folders"):
        load_results(tmp_path)


@pytest.mark.parametrize("bad", ["../escape", "a/b", "", ".hidden", "sp ace", "x" * 200])
def test_unsafe_ids_never_become_paths(tmp_path, bad):
    with pytest.raises(RecordError, match="cannot be used as a file name"):
        record_path(tmp_path, (bad, TARGET, "probe"))
    with pytest.raises(RecordError):
        start_run(tmp_path, command=[], run_id=bad or "..")


def test_start_run_refuses_to_reuse_a_run_folder(tmp_path):
    start_run(tmp_path, command=[], run_id="r1")
    with pytest.raises(RecordError, match="already holds a run"):
        start_run(tmp_path, command=[], run_id="r1")


def test_atomic_write_leaves_no_temporary_files(tmp_path):
    path = tmp_path / "a" / "b.json"
    atomic_write_text(path, "one")
    atomic_write_text(path, "two")
    assert path.read_text() == "two"
    assert sorted(p.name for p in path.parent.iterdir()) == ["b.json"]


def test_failed_write_keeps_the_old_file_and_cleans_up(tmp_path, monkeypatch):
    path = tmp_path / "r.json"
    atomic_write_text(path, "old")

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        atomic_write_text(path, "new")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


@pytest.fixture
def umask():
    """Set the process umask for one test, and put the old one back."""
    old = os.umask(0o022)
    yield os.umask
    os.umask(old)


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_written_files_honour_the_umask(tmp_path, umask, mask, mode):
    """Records, run.json and --out files get 0666 minus the umask, like any file open() creates."""
    umask(mask)
    run_dir = make_run(tmp_path / "results", seed_records()[:1])
    out = tmp_path / "matrix.md"
    atomic_write_text(out, "text")
    build = write_build_record(tmp_path / "out",
                               BuildRecord(stack_id=CU131, stack={}, derived={}, status=BuildStatus.BUILT))
    written = [run_dir / RUN_FILE, next(run_dir.glob("*/*/*.json")), out, build]
    assert {p.name: oct(p.stat().st_mode & 0o777) for p in written} == {p.name: oct(mode) for p in written}


def test_an_explicit_mode_wins_over_the_umask(tmp_path, umask):
    umask(0o077)
    atomic_write_text(tmp_path / "Dockerfile", "FROM x\n", mode=0o644)
    assert (tmp_path / "Dockerfile").stat().st_mode & 0o777 == 0o644


# ---------------------------------------------------------------------------------------------- concurrency


def _writer(run_dir: str, worker: int, rounds: int) -> None:
    """Write the same shared key and a private key many times, with large, distinct payloads."""
    for n in range(rounds):
        evidence = f"worker {worker} round {n} " + "x" * (20_000 + worker * 997)
        shared = record(CU131, "serve", "pass", tier="bench", probe="shared", evidence=evidence,
                        created_at=f"2026-03-01T02:{worker:02d}:{n % 60:02d}+00:00")
        write_record(Path(run_dir), shared)
        write_record(Path(run_dir), dataclasses.replace(shared, probe=f"private-{worker}"))


def _reader(run_dir: str, stop, bad) -> None:
    """Read the shared file in a loop; every read must be one complete record."""
    path = Path(run_dir) / CU131 / TARGET / "shared.json"
    while not stop.is_set():
        try:
            text = path.read_text()
        except FileNotFoundError:
            continue
        try:
            ResultRecord.from_json(json.loads(text))
        except (ValueError, RecordError) as exc:
            bad.value += 1
            print("torn read:", exc)


def test_concurrent_writers_never_tear_a_file(tmp_path):
    context = multiprocessing.get_context("spawn")
    run_dir = start_run(tmp_path, command=["test"], run_id="concurrent")
    stop, bad = context.Event(), context.Value("i", 0)
    reader = context.Process(target=_reader, args=(str(run_dir), stop, bad))
    reader.start()
    writers = [context.Process(target=_writer, args=(str(run_dir), w, 40)) for w in range(4)]
    for process in writers:
        process.start()
    for process in writers:
        process.join(timeout=120)
        assert process.exitcode == 0
    stop.set()
    reader.join(timeout=30)
    assert bad.value == 0
    loaded = load_results(run_dir)
    assert loaded.problems == ()
    assert sorted(r.probe for r in loaded.records) == ["private-0", "private-1", "private-2", "private-3", "shared"]
    shared = next(r for r in loaded.records if r.probe == "shared")
    assert shared.outcome.evidence.startswith("worker ")              # one complete write won
    leftovers = [p.name for p in run_dir.rglob(".*") if p.is_file()]
    assert leftovers == []


# ---------------------------------------------------------------------------------------------- problems


def test_loader_reports_every_problem_with_its_path(tmp_path):
    good = record(CU128, "flashinfer-jit", "pass", tier="gate")
    run_dir = make_run(tmp_path, [good])
    target_dir = run_dir / CU128 / TARGET
    (target_dir / "corrupt.json").write_text('{"schema": "stackforge.result", "run_id": ')
    partial = good.to_json()
    del partial["outcome"]["status"]
    partial["probe"] = "partial"
    (target_dir / "partial.json").write_text(json.dumps(partial))
    newer = dict(good.to_json(), probe="newer", schema_version=RESULT_SCHEMA_VERSION + 1)
    (target_dir / "newer.json").write_text(json.dumps(newer))
    (target_dir / "misplaced.json").write_text(good.dumps())      # the key says flashinfer-jit-gate
    (target_dir / "list.json").write_text("[]")
    (run_dir / "_logs" / "x").mkdir(parents=True)
    (run_dir / "_logs" / "x" / "raw.json").write_text("not json, and not a record: ignored")

    loaded = load_results(run_dir)
    assert [r.probe for r in loaded.records] == ["flashinfer-jit-gate"]
    messages = {Path(p.path).name: p.message for p in loaded.problems}
    assert sorted(messages) == ["corrupt.json", "list.json", "misplaced.json", "newer.json", "partial.json"]
    assert "corrupt JSON (line 1" in messages["corrupt.json"]
    assert "partial or corrupt record" in messages["partial.json"] and "status" in messages["partial.json"]
    assert f"schema_version {RESULT_SCHEMA_VERSION + 1!r} is newer" in messages["newer.json"]
    assert "stored under the wrong name" in messages["misplaced.json"]
    assert "not a stackforge result record" in messages["list.json"]
    with pytest.raises(RecordError) as info:
        loaded.raise_for_problems()
    text = str(info.value)
    assert text.startswith(f"5 unusable result files in {run_dir}:")
    for name in messages:
        assert str(target_dir / name) in text
    assert "--skip-bad" in info.value.remedy


def test_bad_or_missing_run_file_is_a_problem_not_a_crash(tmp_path):
    run_dir = make_run(tmp_path, [record(CU128, "serve", "pass", tier="bench")])
    (run_dir / RUN_FILE).write_text(json.dumps({"schema": "stackforge.run", "schema_version": 99}))
    loaded = load_results(run_dir)
    assert len(loaded.records) == 1
    assert [p.path for p in loaded.problems] == [str(run_dir / RUN_FILE)]
    assert "newer than this stackforge" in loaded.problems[0].message
    (run_dir / RUN_FILE).unlink()
    assert "file is missing" in load_results(run_dir).problems[0].message


# ---------------------------------------------------------------------------------------------- merging


def test_merge_is_idempotent_and_order_independent():
    a = [record(CU128, "serve", "fail", tier="bench", run_id="r1", created_at="2026-03-01T00:00:00+00:00"),
         record(CU131, "serve", "pass", tier="bench", run_id="r1")]
    b = [record(CU128, "serve", "pass", tier="bench", run_id="r2", created_at="2026-03-02T00:00:00+00:00"),
         record(CU128, "flashinfer-jit", "pass", tier="gate", run_id="r2")]
    assert merge_records(a, a) == merge_records(a)
    assert merge_records(a, b) == merge_records(b, a)
    merged = merge_records(a, b)
    assert merge_records(merged, a, b) == merged
    statuses = {r.key: (r.outcome.status.value, r.run_id) for r in merged}
    assert statuses[(CU128, TARGET, "serve-bench")] == ("pass", "r2")      # newer created_at wins
    assert len(merged) == 3


def test_merge_tie_break_is_total():
    same_time = "2026-03-01T00:00:00+00:00"
    r1 = record(CU128, "serve", "fail", tier="bench", run_id="r1", created_at=same_time)
    r2 = record(CU128, "serve", "pass", tier="bench", run_id="r2", created_at=same_time)
    assert merge_records([r1], [r2]) == merge_records([r2], [r1]) == (r2,)       # then run_id
    twin = dataclasses.replace(r1, outcome=Outcome(r1.outcome.status, "other reason"))
    assert merge_records([r1], [twin]) == merge_records([twin], [r1])            # then the JSON text
    zulu = dataclasses.replace(r1, created_at="2026-03-01T00:00:01Z", run_id="r0")
    assert merge_records([r2], [zulu]) == (zulu,)                                 # times are parsed


def test_merge_runs_writes_a_new_run(tmp_path):
    shard_1 = make_run(tmp_path / "s1", [record(CU128, "serve", "pass", tier="bench")], run_id="r-shard1")
    shard_2 = make_run(tmp_path / "s2", [record(CU131, "serve", "pass", tier="bench")], run_id="r-shard2")
    merged = merge_runs([shard_1, tmp_path / "s2"], tmp_path / "merged", command=["stackforge", "results", "merge"],
                        run_id="nightly-1")
    assert merged == tmp_path / "merged" / "nightly-1"
    info = read_run_info(merged)
    assert info.merged_from == ("r-shard1", "r-shard2") and info.host == "ci-1" and info.finished_at
    assert [r.stack_id for r in load_results(merged).records] == [CU128, CU131]
    with pytest.raises(RecordError, match="already exists"):
        merge_runs([shard_1], tmp_path / "merged", run_id="nightly-1")
    (shard_2 / CU131 / TARGET / "broken.json").write_text("{")
    with pytest.raises(RecordError, match="broken.json"):
        merge_runs([shard_1, shard_2], tmp_path / "merged", run_id="nightly-2")
    assert not (tmp_path / "merged" / "nightly-2").exists()
    partial = merge_runs([shard_1, shard_2], tmp_path / "merged", run_id="nightly-3", skip_bad=True)
    assert len(load_results(partial).records) == 2


# ---------------------------------------------------------------------------------------------- schema + contract

TOP_KEYS = {"schema", "schema_version", "run_id", "stack_id", "stack", "target", "probe", "feature", "tier",
            "outcome", "provenance", "kind", "created_at"}
OUTCOME_KEYS = {"status", "reason", "evidence", "metrics", "duration_s"}
PROVENANCE_KEYS = {"image", "image_id", "digest", "versions", "torch_arch_list", "torch_git_version", "torch_cuda",
                   "nvcc", "driver", "gpus", "host", "runner"}


def test_record_contract_key_set_is_pinned():
    data = record(CU128, "serve", "pass", tier="bench").to_json()
    assert set(data) == TOP_KEYS
    assert set(data["outcome"]) == OUTCOME_KEYS
    assert set(data["provenance"]) == PROVENANCE_KEYS
    assert (data["schema"], data["schema_version"]) == ("stackforge.result", 1)


def test_schema_file_matches_the_contract():
    schema = result_schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert set(schema["properties"]) == TOP_KEYS == set(schema["required"])
    assert set(schema["properties"]["outcome"]["properties"]) == OUTCOME_KEYS
    assert set(schema["properties"]["provenance"]["properties"]) == PROVENANCE_KEYS


def check(instance, schema, where="$"):
    """A tiny JSON Schema checker for the keywords result.schema.json uses; returns error strings."""
    errors = []
    kinds = {"object": dict, "array": list, "string": str, "number": (int, float), "integer": int,
             "null": type(None), "boolean": bool}
    if "const" in schema and instance != schema["const"]:
        errors.append(f"{where}: {instance!r} != const {schema['const']!r}")
    if "enum" in schema and instance not in schema["enum"]:
        errors.append(f"{where}: {instance!r} not in {schema['enum']}")
    if "type" in schema:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(isinstance(instance, kinds[t]) and not (t in ("number", "integer") and isinstance(instance, bool))
                   for t in types):
            errors.append(f"{where}: {instance!r} is not {types}")
    if isinstance(instance, str) and len(instance) < schema.get("minLength", 0):
        errors.append(f"{where}: shorter than {schema['minLength']}")
    if isinstance(instance, (int, float)) and "minimum" in schema and instance < schema["minimum"]:
        errors.append(f"{where}: below {schema['minimum']}")
    if isinstance(instance, dict):
        errors += [f"{where}: missing {k}" for k in schema.get("required", ()) if k not in instance]
        props = schema.get("properties", {})
        for key, value in instance.items():
            if key in props:
                errors += check(value, props[key], f"{where}.{key}")
            elif schema.get("additionalProperties") is False:
                errors.append(f"{where}: unexpected key {key}")
            elif isinstance(schema.get("additionalProperties"), dict):
                errors += check(value, schema["additionalProperties"], f"{where}.{key}")
    if isinstance(instance, list) and "items" in schema:
        for index, item in enumerate(instance):
            errors += check(item, schema["items"], f"{where}[{index}]")
    return errors


@pytest.mark.parametrize("rec", seed_records(), ids=lambda r: f"{r.stack_id[:5]}-{r.probe}")
def test_every_record_validates_against_the_schema(rec):
    assert check(rec.to_json(), result_schema()) == []


def test_an_undecided_record_validates_and_round_trips():
    rec = record(CU128, "torch-symm-mem", "undecided", tier="gate", reason="needs a running server",
                 evidence="ValueError: config namespace 'exec' not published")
    assert check(rec.to_json(), result_schema()) == []
    assert ResultRecord.from_json(json.loads(rec.dumps())) == rec


@pytest.mark.parametrize("mutate, fragment", [
    (lambda d: d.pop("outcome"), "missing outcome"),
    (lambda d: d.update(schema_version=2), "!= const 1"),
    (lambda d: d["outcome"].update(status="maybe"), "not in"),
    (lambda d: d.update(tier="cloud"), "not in"),
    (lambda d: d["provenance"].update(secret="x"), "unexpected key secret"),
    (lambda d: d["outcome"].update(duration_s="slow"), "is not"),
])
def test_schema_rejects_broken_records(mutate, fragment):
    data = record(CU128, "serve", "pass", tier="bench").to_json()
    mutate(data)
    errors = check(data, result_schema())
    assert any(fragment in e for e in errors), errors


def test_schema_is_valid_draft_2020_12_when_jsonschema_is_installed():
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema not installed (optional cross-check)")
    validator = jsonschema.Draft202012Validator(result_schema())
    jsonschema.Draft202012Validator.check_schema(result_schema())
    for rec in seed_records():
        validator.validate(rec.to_json())


def test_run_info_roundtrip_and_rejects_newer():
    info = RunInfo(run_id="r", started_at="2026-03-01T00:00:00+00:00", command=("a", "b"), merged_from=("x",))
    assert RunInfo.from_json(info.to_json()) == info
    with pytest.raises(RecordError, match="newer"):
        RunInfo.from_json({**info.to_json(), "schema_version": 2}, path="run.json")
