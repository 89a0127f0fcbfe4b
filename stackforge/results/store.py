"""The results store: a folder of versioned JSON records, one run per folder, merged by key.

Layout (everything below ``<results>`` is plain files, so runs can be copied, rsynced, sharded and merged)::

    <results>/<run-id>/run.json                          run metadata (RunInfo)
    <results>/<run-id>/planned.json                      the jobs a probe run set out to run (its manifest)
    <results>/<run-id>/<stack-id>/<target>/<probe>.json  one ResultRecord per (stack, target, probe)
    <results>/<run-id>/_<anything>/...                   ignored by the loader (logs, raw bench output)

Guarantees:

* Writes are atomic (:func:`stackforge.core.fsio.atomic_write_text`): the text goes to a temporary file in
  the same folder, is flushed to disk, then ``os.replace``-d over the final name. Concurrent writers (threads or processes, same or different
  keys) never leave a torn file; for the same key the last complete write wins. Temporary files
  start with ``.`` and are never read as records.
* Loading never drops anything silently: every corrupt, partial, misplaced or newer-schema file is
  collected as a :class:`~stackforge.core.errors.RecordError` naming its path; the caller decides whether
  that is fatal (the default) or a warning (``--skip-bad``).
* Merging is a pure function of the records: by key ``(stack_id, target, probe)``, evidence ranks before
  time: a record that measured something (``pass``, ``fail``, ``crash``, ``timeout``: the software under
  test decided) outranks any record that measured nothing (``skip`` "not built here", ``error`` "no image",
  ``undecided``), however much newer; then the newest ``created_at`` wins, then the larger ``run_id``, then
  the larger canonical JSON text. That total order makes the merge idempotent and independent of the order
  of its inputs. A newer record that measured nothing and lost to an older measurement is kept apart
  (:attr:`LoadedResults.shadowed`), so the reports can say "last run: not built here".
* A record dated after this machine's clock (beyond :data:`FUTURE_TOLERANCE`) is refused when loaded, like a
  corrupt file: it would win every later merge.
* A partial run says so: ``run.json`` carries how many jobs the run planned (``planned``) and, when it was cut
  short, why (``ended``: "interrupted by SIGTERM", "ended early: <error>"); ``planned.json`` lists the planned
  jobs of a probe run. A run without ``finished_at`` is partial (:attr:`LoadedResults.partial`): the reports
  name it and read its jobs that never ran as "not run" (:mod:`stackforge.report.evidence`).
"""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from importlib import resources
from pathlib import Path
from typing import Any

from stackforge import __version__
from stackforge.core.envelope import check_envelope, document_text
from stackforge.core.errors import RecordError
from stackforge.core.fsio import atomic_write_text
from stackforge.core.records import PlannedJob, ResultRecord, Status, Tier, new_run_id, utc_now

__all__ = [
    "HOST_FILE", "PLANNED_FILE", "RUN_FILE", "RUN_SCHEMA", "RUN_SCHEMA_VERSION", "LoadedResults", "PartialRun",
    "RunInfo", "describe_problems", "FUTURE_TOLERANCE", "MEASURED_STATUSES", "end_run_early", "finish_run",
    "holds_results", "load_results", "merge_records", "merge_runs", "merge_with_shadowed",
    "read_run_info", "record_path", "result_schema", "start_run", "write_record",
]

RUN_FILE = "run.json"
#: What the host a run's GPU jobs ran on showed: its GPUs, driver and how the cards connect (nvidia-smi
#: topo -m). A P2P fault found in the run is judged against it: the host's, not the stack's.
HOST_FILE = "host.json"
#: The jobs a probe run set out to run, written before the first one starts: what a partial run did not reach.
PLANNED_FILE = "planned.json"
PLANNED_SCHEMA = "stackforge.planned"
RUN_SCHEMA = "stackforge.run"
RUN_SCHEMA_VERSION = 1
# Ids become folder and file names: keep them to one safe path component.
_SAFE_COMPONENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,159}")
_OLDEST = datetime.min.replace(tzinfo=timezone.utc)
#: Statuses of a record in which the software under test decided something: they outrank the others in a merge.
MEASURED_STATUSES = frozenset({Status.PASS, Status.FAIL, Status.CRASH, Status.TIMEOUT})
#: How far after this machine's clock a record may be dated (clock skew between CI machines) before it is refused.
FUTURE_TOLERANCE = timedelta(hours=1)
#: How deep a run or record file may nest lists and objects: what stackforge writes stays below 10.
MAX_NESTING = 64
_TOO_DEEP = object()


@dataclass(frozen=True, slots=True)
class RunInfo:
    """Metadata of one run folder (``run.json``).

    Attributes:
        run_id: the folder name, e.g. ``20260301T020000Z-3f9a1c``.
        started_at / finished_at: ISO-8601 UTC; ``finished_at`` is ``None`` while the run is going
            (or when it died: a run without ``finished_at`` is partial, and reports say so).
        host: the machine that ran it.
        command: argv of the stackforge command that made it.
        matrix_source: the matrix file the run was planned from.
        stackforge_version: the version that wrote it.
        shard: ``"K/N"`` when the run is one shard of a larger run, else ``None``.
        merged_from: run ids this run was merged from (empty for a run that measured things).
        planned: how many jobs the run set out to run (None: not recorded, e.g. a run of an older version).
        ended: why the run stopped before its planned jobs were done ("interrupted by SIGTERM", "ended early:
            <error>"), None while it goes, when it finished, or when it died too hard to say (SIGKILL).
    """

    run_id: str
    started_at: str
    finished_at: str | None = None
    host: str = ""
    command: tuple[str, ...] = ()
    matrix_source: str = ""
    stackforge_version: str = __version__
    shard: str | None = None
    merged_from: tuple[str, ...] = ()
    planned: int | None = None
    ended: str | None = None

    def to_json(self) -> dict[str, Any]:
        """Plain JSON dict with the schema envelope."""
        return {"schema": RUN_SCHEMA, "schema_version": RUN_SCHEMA_VERSION, "run_id": self.run_id,
                "started_at": self.started_at, "finished_at": self.finished_at, "host": self.host,
                "command": list(self.command), "matrix_source": self.matrix_source,
                "stackforge_version": self.stackforge_version, "shard": self.shard,
                "merged_from": list(self.merged_from),
                # Only when known: a run file of a run that planned nothing it could count stays as it was.
                **({"planned": self.planned} if self.planned is not None else {}),
                **({"ended": self.ended} if self.ended is not None else {})}

    @classmethod
    def from_json(cls, data: Any, *, path: str = "") -> RunInfo:
        """Validate and load ``run.json``; corrupt, partial or newer files raise RecordError."""
        check_envelope(data, schema=RUN_SCHEMA, supported=RUN_SCHEMA_VERSION, what="run file", path=path)
        try:
            return cls(run_id=str(data["run_id"]), started_at=str(data["started_at"]),
                       finished_at=_optional_str(data.get("finished_at")), host=str(data.get("host", "")),
                       command=tuple(str(a) for a in data.get("command", ())),
                       matrix_source=str(data.get("matrix_source", "")),
                       stackforge_version=str(data.get("stackforge_version", "")),
                       shard=_optional_str(data.get("shard")),
                       merged_from=tuple(str(r) for r in data.get("merged_from", ())),
                       planned=_optional_count(data.get("planned")), ended=_optional_str(data.get("ended")))
        except (KeyError, TypeError, ValueError) as exc:
            raise RecordError(f"partial or corrupt run file: {type(exc).__name__}: {exc}",
                              path=path) from None


@dataclass(frozen=True, slots=True)
class PartialRun:
    """A run that did not finish: how far it got, why it stopped (when it could say), and the planned jobs of a
    probe run that never ran (read from its ``planned.json``).

    Attributes:
        run_id / started_at: the run's.
        ran: how many records the run holds.
        planned: how many jobs it set out to run (None: not recorded).
        ended: why it stopped (``RunInfo.ended``), None when it could not say (killed, or still running).
        not_run: planned jobs without a record in the run (empty when the run kept no manifest).
        manifest: whether the run kept a ``planned.json`` (a probe run; others plan readings or benches).
    """

    run_id: str
    started_at: str
    ran: int
    planned: int | None
    ended: str | None
    not_run: tuple[PlannedJob, ...] = ()
    manifest: bool = False

    @property
    def kind(self) -> str:
        """``interrupted``, ``ended early`` (an error stopped it) or ``unfinished`` (it could not say)."""
        if self.ended is None:
            return "unfinished"
        return "interrupted" if self.ended.startswith("interrupted") else "ended early"

    def line(self) -> str:
        """``interrupted: 1 of 8 probes ran (run <id>; interrupted by SIGTERM)``."""
        noun = "probes" if self.manifest else "jobs"
        of = f"{self.ran} of {self.planned} {noun} ran" if self.planned is not None else \
            f"{self.ran} {noun} ran, how many were planned is not recorded"
        why = self.ended or "it recorded no end: killed, or still running"
        return f"{self.kind}: {of} (run {self.run_id}; {why})"

    def not_run_reason(self) -> str:
        """What a cell of a job this run never reached says: ``not run (run interrupted)``."""
        return f"not run (run {self.kind})"


@dataclass(frozen=True, slots=True)
class LoadedResults:
    """What a results folder holds: the records (merged by key), the runs, and every problem found.

    Attributes:
        records: valid records, merged by key across the loaded runs, sorted by key.
        runs: metadata of the runs that were loaded (sorted by run id).
        problems: one RecordError per file that could not be used; never silently empty.
        shadowed: newer records that measured nothing (skip, error, undecided) and lost the merge to an
            older measurement of the same key: what the last run said, for a note.
        partial: the loaded runs that did not finish (interrupted, ended early, killed or still running).
        hosts: run id -> that run's ``host.json`` (host facts and the host check written at its start), for the
            runs that have one; reports judge a GPU record of a run whose host check failed as the host's.
    """

    records: tuple[ResultRecord, ...]
    runs: tuple[RunInfo, ...] = ()
    problems: tuple[RecordError, ...] = ()
    source: str = ""
    shadowed: tuple[ResultRecord, ...] = ()
    partial: tuple[PartialRun, ...] = ()
    hosts: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def shadowed_note(self, examples: int = 3) -> str:
        """One line on the measurements kept over newer runs that measured nothing ("" when there are none)."""
        if not self.shadowed:
            return ""
        shown = "; ".join(f"{r.stack_id} {r.probe}: last run {r.outcome.status.value} ({r.outcome.reason[:80]})"
                          for r in self.shadowed[:examples])
        more = f"; and {len(self.shadowed) - examples} more" if len(self.shadowed) > examples else ""
        return (f"kept {len(self.shadowed)} measured record(s) over newer runs that measured nothing (a run that "
                f"finds no image or skips never hides evidence): {shown}{more}")

    def raise_for_problems(self) -> None:
        """Raise one RecordError listing every problem, if there is any."""
        if self.problems:
            raise RecordError(describe_problems(self.problems, self.source),
                              remedy="fix or remove these files, or pass --skip-bad to load the rest")


def describe_problems(problems: Sequence[RecordError], source: str = "") -> str:
    """A multi-line message: a count, then one ``path: problem`` line per bad file."""
    where = f" in {source}" if source else ""
    head = f"{len(problems)} unusable result file{'s' if len(problems) != 1 else ''}{where}:"
    # One problem per line; the ';' keeps them apart when the CLI flattens an error to one line.
    return head + ";".join(f"\n  {problem.message}" for problem in problems)


# ---------------------------------------------------------------------------------------------- writing


def record_path(run_dir: Path, key: tuple[str, str, str]) -> Path:
    """``<run_dir>/<stack-id>/<target>/<probe>.json`` for a record key; unsafe ids raise RecordError."""
    stack_id, target, probe = (_safe_component(part, what) for part, what in
                               zip(key, ("stack id", "target", "probe"), strict=True))
    return run_dir / stack_id / target / f"{probe}.json"


def write_record(run_dir: Path, record: ResultRecord) -> Path:
    """Atomically write one record into its run folder; returns the file's path."""
    path = record_path(run_dir, record.key)
    atomic_write_text(path, record.dumps())
    return path


def start_run(results_root: Path, *, command: Sequence[str], matrix_source: str = "",
              shard: str | None = None, run_id: str | None = None, host: str | None = None,
              planned: int | None = None, jobs: Sequence[PlannedJob] = ()) -> Path:
    """Create a run folder with its ``run.json`` (``finished_at`` unset) and return the folder.

    ``planned``: how many jobs the run sets out to run; ``jobs``: those jobs, when they are probes (written to
    ``planned.json`` first, so that a run cut short at any point says what it did not reach).

    Raises:
        RecordError: ``run_id`` is not a safe folder name, or that run folder holds a run already.
    """
    run_id = _safe_component(run_id or new_run_id(), "run id")
    run_dir = results_root / run_id
    if (run_dir / RUN_FILE).exists():
        raise RecordError("run folder already holds a run", path=str(run_dir),
                          remedy="choose another --run-id or remove the folder")
    from stackforge.edges.pip_config import redact_urls

    # The command line may carry an index URL with ``user:password@`` (--index-url): kept without it.
    info = RunInfo(run_id=run_id, started_at=utc_now(), host=host or socket.gethostname(),
                   command=tuple(redact_urls(arg) for arg in command), matrix_source=matrix_source, shard=shard,
                   planned=planned if planned is not None else (len(jobs) if jobs else None))
    if jobs:
        atomic_write_text(run_dir / PLANNED_FILE, document_text(_planned_json(jobs)))
    atomic_write_text(run_dir / RUN_FILE, document_text(info.to_json()))
    return run_dir


def end_run_early(run_dir: Path, why: str) -> RunInfo:
    """Say in ``run.json`` why the run stops before its planned jobs are done (``finished_at`` stays unset)."""
    info = read_run_info(run_dir)
    ended = RunInfo(**{**_fields(info), "ended": why})
    atomic_write_text(run_dir / RUN_FILE, document_text(ended.to_json()))
    return ended


def write_host_facts(run_dir: Path, facts: dict[str, Any]) -> Path:
    """Write the run's host facts (``host.json``, beside ``run.json``; never read as a record)."""
    path = run_dir / HOST_FILE
    atomic_write_text(path, document_text({"schema": "stackforge.host", "schema_version": 1, **facts}))
    return path


def finish_run(run_dir: Path) -> RunInfo:
    """Stamp ``finished_at`` into the run's ``run.json`` and return the updated metadata."""
    info = read_run_info(run_dir)
    done = RunInfo(**{**_fields(info), "finished_at": utc_now()})
    atomic_write_text(run_dir / RUN_FILE, document_text(done.to_json()))
    return done


@dataclass(frozen=True, slots=True)
class ResultsFolder:
    """A results root as a campaign uses it: one run folder per run, its records, and the runs before it.

    Campaigns (:func:`stackforge.jobs.campaign.campaign_run` and those that use it) sit below this
    module and receive it as a value, so the store stays the one place that lays out result files.
    """

    root: Path
    command: tuple[str, ...] = ()

    def start(self, *, matrix_source: str, shard: str | None, planned: int | None = None,
              jobs: Sequence[PlannedJob] = ()) -> Path:
        return start_run(self.root, command=self.command, matrix_source=matrix_source, shard=shard,
                         planned=planned, jobs=jobs)

    def write(self, run_dir: Path, record: ResultRecord) -> Path:
        return write_record(run_dir, record)

    def note_host(self, run_dir: Path, facts: dict[str, Any]) -> Path:
        return write_host_facts(run_dir, facts)

    def finish(self, run_dir: Path) -> RunInfo:
        return finish_run(run_dir)

    def end_early(self, run_dir: Path, why: str) -> RunInfo:
        return end_run_early(run_dir, why)

    def records(self, *, remedy: str) -> tuple[ResultRecord, ...]:
        """Every record under the root, read strictly: a file that does not load is an error, not a gap.

        Raises:
            RecordError: naming every file that did not load.
        """
        loaded = load_results(self.root)
        if loaded.problems:
            raise RecordError(describe_problems(loaded.problems, loaded.source),
                              remedy=remedy)
        return tuple(loaded.records)


# ---------------------------------------------------------------------------------------------- reading


def read_run_info(run_dir: Path) -> RunInfo:
    """Load ``<run_dir>/run.json``; raises RecordError when it is missing, corrupt or newer."""
    path = run_dir / RUN_FILE
    return RunInfo.from_json(_read_json(path), path=str(path))


def load_results(path: Path, *, runs: Sequence[str] = ()) -> LoadedResults:
    """Load a run folder, or every run under a results root, collecting all problems.

    Args:
        path: a run folder (it has ``run.json`` or record files) or a folder of run folders.
        runs: when ``path`` is a results root, only these run ids (``"latest"`` = the newest id).

    Returns:
        :class:`LoadedResults`; records of several runs are merged by key (newest wins).

    Raises:
        RecordError: ``path`` does not exist or holds no run at all (nothing to show is an error,
            not an empty matrix), or a requested run id is not there.
    """
    if not path.is_dir():
        raise RecordError("results folder does not exist", path=str(path),
                          remedy="run `stackforge probe` first or pass --results")
    run_dirs = [path] if _looks_like_run(path) else _select_runs(path, runs)
    infos: list[RunInfo] = []
    groups: list[list[ResultRecord]] = []
    problems: list[RecordError] = []
    partial: list[PartialRun] = []
    hosts: dict[str, Mapping[str, Any]] = {}
    for run_dir in run_dirs:
        info, records, run_problems = _load_run(run_dir)
        infos.extend([info] if info else [])
        if info is not None and (run_dir / HOST_FILE).is_file():
            try:
                hosts[info.run_id] = _host_facts(run_dir / HOST_FILE)
            except RecordError as exc:
                problems.append(exc)
        groups.append(records)
        problems.extend(run_problems)
        if info is not None and info.finished_at is None:
            try:
                partial.append(_partial_run(run_dir, info, records))
            except RecordError as exc:
                problems.append(exc)
    winners, shadowed = merge_with_shadowed(*groups)
    return LoadedResults(records=winners, runs=tuple(sorted(infos, key=lambda i: i.run_id)),
                         problems=tuple(problems), source=str(path), shadowed=shadowed,
                         partial=tuple(sorted(partial, key=lambda p: p.run_id)), hosts=hosts)


def _host_facts(path: Path) -> Mapping[str, Any]:
    """A run's ``host.json``: a JSON object, or a RecordError naming the file."""
    data = _read_json(path)
    if not isinstance(data, dict):
        raise RecordError("host facts are not a JSON object", path=str(path))
    return data


def holds_results(path: Path) -> bool:
    """Whether ``path`` is a run folder or a results folder with at least one run (nothing is read)."""
    if not path.is_dir():
        return False
    return _looks_like_run(path) or any(p.is_dir() and not p.name.startswith((".", "_")) and _looks_like_run(p)
                                        for p in path.iterdir())


def result_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a result record file, as shipped in the package."""
    text = resources.files("stackforge").joinpath("schemas/result.schema.json").read_text(encoding="utf-8")
    return json.loads(text)


# ---------------------------------------------------------------------------------------------- merging


def merge_records(*groups: Iterable[ResultRecord]) -> tuple[ResultRecord, ...]:
    """Merge record collections by key; for each key the record with the highest precedence wins.

    Precedence: a measurement (:data:`MEASURED_STATUSES`) before a record that measured nothing, then newer
    ``created_at``, then larger ``run_id``, then larger canonical JSON text (a total order, so
    ``merge(a, b) == merge(b, a)`` and ``merge(a, a) == merge(a)``). Returns the winners sorted by key.
    """
    return merge_with_shadowed(*groups)[0]


def merge_with_shadowed(*groups: Iterable[ResultRecord]) -> tuple[tuple[ResultRecord, ...], tuple[ResultRecord, ...]]:
    """:func:`merge_records`, and for each key whose winner is an older measurement, the newest record that
    measured nothing after it (what the last run said)."""
    winners: dict[tuple[str, str, str], ResultRecord] = {}
    latest: dict[tuple[str, str, str], ResultRecord] = {}
    for group in groups:
        for record in group:
            held = winners.get(record.key)
            if held is None or _precedence(record) > _precedence(held):
                winners[record.key] = record
            newest = latest.get(record.key)
            if newest is None or _by_time(record) > _by_time(newest):
                latest[record.key] = record
    shadowed = tuple(latest[key] for key in sorted(winners)
                     if latest[key] is not winners[key] and _by_time(latest[key]) > _by_time(winners[key]))
    return tuple(winners[key] for key in sorted(winners)), shadowed


def merge_runs(run_dirs: Sequence[Path], results_root: Path, *, command: Sequence[str] = (),
               run_id: str | None = None, skip_bad: bool = False) -> Path:
    """Merge several run folders (e.g. the shards of a nightly run) into a new run folder.

    Args:
        run_dirs: run folders to merge (each must hold a run; problems are collected from all).
        results_root: where the merged run folder is created.
        command: argv recorded in the merged ``run.json``.
        run_id: id of the merged run (default: a new id ending in ``-merged``).
        skip_bad: merge what loads and ignore unusable files instead of refusing.

    Returns:
        The new run folder.

    Raises:
        RecordError: an input holds unusable files (unless ``skip_bad``), or the target exists.
    """
    loaded = [load_results(run_dir) for run_dir in run_dirs]
    problems = tuple(p for result in loaded for p in result.problems)
    if problems and not skip_bad:
        LoadedResults((), problems=problems, source=", ".join(map(str, run_dirs))).raise_for_problems()
    infos = [info for result in loaded for info in result.runs]
    run_id = _safe_component(run_id or f"{new_run_id()}-merged", "run id")
    run_dir = results_root / run_id
    if run_dir.exists():
        raise RecordError("merge target already exists", path=str(run_dir), remedy="choose another run id")
    for record in merge_records(*(result.records for result in loaded)):
        write_record(run_dir, record)
    atomic_write_text(run_dir / RUN_FILE, document_text(_merged_info(run_id, infos, command).to_json()))
    return run_dir


# ---------------------------------------------------------------------------------------------- internals


def _merged_info(run_id: str, infos: Sequence[RunInfo], command: Sequence[str]) -> RunInfo:
    """Metadata of a merged run: the span of its inputs and where they came from."""
    started = min((i.started_at for i in infos), default=utc_now())
    finished = [i.finished_at for i in infos if i.finished_at is not None]
    sources = sorted({i.matrix_source for i in infos if i.matrix_source})
    # One unfinished input makes the merge partial too: keep that visible, with why each input stopped.
    complete = bool(infos) and len(finished) == len(infos)
    planned = [i.planned for i in infos]
    ended = "; ".join(f"{i.run_id}: {i.ended}" for i in infos if i.ended)
    return RunInfo(run_id=run_id, started_at=started, finished_at=max(finished) if complete else None,
                   host=", ".join(sorted({i.host for i in infos if i.host})), command=tuple(command),
                   matrix_source=", ".join(sources), merged_from=tuple(sorted(i.run_id for i in infos)),
                   planned=sum(p for p in planned if p is not None) if None not in planned and planned else None,
                   ended=ended or None)


def _planned_json(jobs: Sequence[PlannedJob]) -> dict[str, Any]:
    """``planned.json``: each stack's description once, then one ``[stack, target, probe, feature, tier]`` per job."""
    stacks = {job.stack_id: job.stack for job in jobs}
    return {"schema": PLANNED_SCHEMA, "schema_version": 1, "stacks": stacks,
            "jobs": [[j.stack_id, j.target, j.probe, j.feature, j.tier.value] for j in jobs]}


def _read_planned(run_dir: Path) -> tuple[PlannedJob, ...] | None:
    """The jobs of a run's ``planned.json``, None when the run kept none; a corrupt one raises RecordError."""
    path = run_dir / PLANNED_FILE
    if not path.exists():
        return None
    data = _read_json(path)
    check_envelope(data, schema=PLANNED_SCHEMA, supported=1, what="planned-jobs file", path=str(path))
    try:
        stacks = data["stacks"]
        return tuple(PlannedJob(stack_id=str(s), stack=dict(stacks[s]), target=str(t), probe=str(p),
                                feature=str(f), tier=Tier(tier)) for s, t, p, f, tier in data["jobs"])
    except (KeyError, TypeError, ValueError) as exc:
        raise RecordError(f"partial or corrupt planned-jobs file: {type(exc).__name__}: {exc}",
                          path=str(path)) from None


def _partial_run(run_dir: Path, info: RunInfo, records: Sequence[ResultRecord]) -> PartialRun:
    """How far an unfinished run got, from its own records and its manifest."""
    planned = _read_planned(run_dir)
    done = {record.key for record in records}
    not_run = tuple(job for job in planned or () if job.key not in done)
    return PartialRun(run_id=info.run_id, started_at=info.started_at, ran=len(records), planned=info.planned,
                      ended=info.ended, not_run=not_run, manifest=planned is not None)


def _load_run(run_dir: Path) -> tuple[RunInfo | None, list[ResultRecord], list[RecordError]]:
    """One run folder: its metadata, its valid records, and a RecordError per unusable file."""
    problems: list[RecordError] = []
    info = None
    try:
        info = read_run_info(run_dir)
    except RecordError as exc:
        problems.append(exc)
    records = []
    latest_allowed = datetime.now(timezone.utc) + FUTURE_TOLERANCE
    for path in _record_files(run_dir):
        try:
            record = _load_record(run_dir, path)
        except RecordError as exc:
            problems.append(exc)
            continue
        if _parse_time(record.created_at) > latest_allowed:
            problems.append(RecordError(f"record is dated {record.created_at}, after this machine's clock "
                                        f"({utc_now()}): a record from the future would win every later merge",
                                        path=str(path)))
            continue
        records.append(record)
    return info, records, problems


def _load_record(run_dir: Path, path: Path) -> ResultRecord:
    """Load one record file and check that it sits where its key says it should."""
    record = ResultRecord.from_json(_read_json(path), path=str(path))
    expected = record_path(run_dir, record.key)
    if expected != path:
        raise RecordError(f"record for {record.key} is stored under the wrong name "
                          f"(expected {expected.relative_to(run_dir)})", path=str(path),
                          remedy="files are named <stack-id>/<target>/<probe>.json; do not rename them")
    return record


def _record_files(run_dir: Path) -> list[Path]:
    """Record files at ``<stack>/<target>/<probe>.json``; ``.``/``_``-prefixed entries are skipped."""
    return sorted(p for p in run_dir.glob("*/*/*.json")
                  if not any(part.startswith((".", "_")) for part in p.relative_to(run_dir).parts))


def _read_json(path: Path) -> Any:
    """Parse a JSON file; unreadable, invalid or runaway-nested JSON raises RecordError with the path."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RecordError("file is missing", path=str(path)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RecordError(f"cannot read file: {exc}", path=str(path)) from None
    except json.JSONDecodeError as exc:
        raise RecordError(f"corrupt JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})",
                          path=str(path)) from None
    except RecursionError:
        data = _TOO_DEEP
    if data is _TOO_DEEP or _deeper_than(data, MAX_NESTING):
        # Refused here, by file: deeper data would reach the recursion limit later (merging, reports)
        # with nothing to say which file it came from.
        raise RecordError(f"JSON nested deeper than {MAX_NESTING} levels: not a file stackforge wrote",
                          path=str(path), remedy="remove the file, or pass --skip-bad to load the rest")
    return data


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether ``value`` nests lists and dicts more than ``limit`` deep (walked without recursion)."""
    level: list[Any] = [value]
    for _ in range(limit + 1):
        level = [child for item in level if isinstance(item, (dict, list))
                 for child in (item.values() if isinstance(item, dict) else item)]
        if not level:
            return False
    return True


def _looks_like_run(path: Path) -> bool:
    return (path / RUN_FILE).is_file() or bool(_record_files(path))


def _select_runs(root: Path, wanted: Sequence[str]) -> list[Path]:
    """The run folders under a results root, restricted to ``wanted`` ids when given."""
    found = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))
                   and _looks_like_run(p))
    if not found:
        raise RecordError("no run folders here (expected <run-id>/run.json)", path=str(root))
    if not wanted:
        return found
    by_id = {p.name: p for p in found}
    chosen = [found[-1] if run == "latest" else by_id.get(run) for run in wanted]
    missing = [run for run, path in zip(wanted, chosen, strict=True) if path is None]
    if missing:
        raise RecordError(f"no such run: {', '.join(missing)} (have: {', '.join(sorted(by_id))})",
                          path=str(root))
    return [path for path in chosen if path is not None]


def _precedence(record: ResultRecord) -> tuple[bool, datetime, str, str, str]:
    return (record.outcome.status in MEASURED_STATUSES, *_by_time(record))


def _by_time(record: ResultRecord) -> tuple[datetime, str, str, str]:
    return (_parse_time(record.created_at), record.created_at, record.run_id, record.dumps())


def _parse_time(text: str) -> datetime:
    """ISO-8601 to an aware datetime; empty or unparsable sorts as oldest (then by its text)."""
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return _OLDEST
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def _safe_component(value: str, what: str) -> str:
    if not isinstance(value, str) or not _SAFE_COMPONENT.fullmatch(value) or value in {".", ".."}:
        raise RecordError(f"{what} {value!r} cannot be used as a file name "
                          "(letters, digits and . _ + - only, starting with a letter or digit)")
    return value


def _optional_str(value: Any) -> str | None:
    return None if value is None else str(value)


def _optional_count(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"planned must be a count, not {value!r}")
    return value


def _fields(info: RunInfo) -> dict[str, Any]:
    return {name: getattr(info, name) for name in RunInfo.__dataclass_fields__}

