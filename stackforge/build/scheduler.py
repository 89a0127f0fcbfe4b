"""Build many stacks: bounded parallelism, per-stack status, retries, logs, records, resume, Ctrl-C.

:func:`build_stacks` runs each (stack, derived) cell through the same phases::

    base     find the base image (local, pulled, --base-image, or an honest substitute)
    render   compose the Dockerfile + context (stackforge.compose.dockerfile), write it under <out>/contexts/
    build    BuildKit (docker buildx) or the classic SDK builder; transient network errors are retried
    metadata labels known only afterwards (content hash, pip freeze, base id) in a LABEL-only step
    verify   testinfra inside the image: the versions installed are the versions asked for
    push     optional: push to a registry, record the repo digest

Stacks never stop each other: a failure is that stack's status (with the deciding log line), and the
run goes on. Each stack gets one log per run (``<out>/logs/<id>.<run-id>.log``; the record names it) and
one record (``<out>/builds/<id>.json``, written atomically); two runs that build one stack into one
``<out>`` take turns (:mod:`stackforge.build.claim`). Ctrl-C (or SIGTERM / SIGHUP, which the CLI turns
into the same interruption) stops running build processes, removes this run's containers, keeps
finished records, and raises :class:`~stackforge.core.errors.Interrupted` carrying the signal.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import sys
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import docker.errors

from stackforge import __version__
from stackforge.build import buildkit, classic
from stackforge.build.assets import AssetServer
from stackforge.build.base import BaseResolver
from stackforge.build.buildkit import BuildAttempt
from stackforge.build.cancel import Cancel
from stackforge.build.claim import stack_claim
from stackforge.build.classify import backtracking_note, diagnose
from stackforge.build.locking import LockOutcome, lock_stacks
from stackforge.build.metadata import add_labels, dynamic_labels, provenance_note, read_freeze
from stackforge.build.options import Builder, BuildOptions
from stackforge.build.progress import Board, ProgressView, summary_table
from stackforge.build.records import (
    BaseImage,
    BuildRecord,
    BuildStatus,
    BuildSummary,
    log_path,
    read_record,
    write_record,
)
from stackforge.build.requires import RequirementsLookup, declared_for, dropped_warning
from stackforge.build.verify import ImageVerification, label_check, lock_check, verify_image
from stackforge.compose.dockerfile import (
    ASSET_PORT_ARG,
    INLINE_DEPS_SUFFIX,
    Composed,
    compose_stack,
    write_context,
)
from stackforge.core.errors import (
    CommandError,
    HostError,
    Interrupted,
    RecordError,
    SpecError,
    StackforgeError,
    interrupt_signal,
)
from stackforge.core.model import Stack
from stackforge.core.records import Status, new_run_id, utc_now
from stackforge.edges import docker_engine, registry, runner
from stackforge.edges.registry import Repository
from stackforge.plan.derive import Derived

BuildCell = tuple[Stack, Derived]


@dataclass
class _Run:
    """What every worker of one run shares (created per call; nothing lives at module level)."""

    client: docker.DockerClient
    options: BuildOptions
    builder: str                    # "buildkit" | "classic"
    named_contexts: bool
    asset_port: int | None          # the asset server's port; None: no server runs
    run_id: str
    cancel: Cancel
    board: Board
    resolver: BaseResolver
    requirements: RequirementsLookup
    redact: tuple[str, ...]
    locks: dict[str, LockOutcome] = field(default_factory=dict)
    container_labels: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)   # appended by workers (list.append is atomic)


def build_stacks(cells: Sequence[BuildCell], options: BuildOptions, *, client: docker.DockerClient,
                 progress: bool = False) -> BuildSummary:
    """Build every cell; return the summary (a failed stack does not raise; Ctrl-C does).

    Raises:
        SpecError: duplicate stacks, or a missing wheelhouse / CA bundle.
        HostError: ``--builder buildx`` without a working buildx.
        Interrupted: Ctrl-C; running builds were stopped and finished records kept.
    """
    cells = _unique(cells)
    _check_inputs(options)
    locks = lock_stacks(cells, options.lock, out_dir=Path(options.out_dir), indexes=options.resolver_indexes(),
                        compose=options.compose_options(buildkit=True, base_image=None),
                        timeout=options.resolve_timeout_s)
    for stack_id, outcome in locks.items():   # the resolution step and its time, before any image work
        print(f"{stack_id}: {outcome.line()}", file=sys.stderr, flush=True)
    builder = choose_builder(options.builder)
    named_contexts = builder == "buildkit" and buildkit.supports_named_contexts(buildkit.buildkit_version())
    started = time.monotonic()
    with _asset_server(options, builder, named_contexts) as port:
        run = _Run(client=client, options=options, builder=builder, named_contexts=named_contexts,
                   asset_port=port, run_id=new_run_id(), cancel=Cancel(),
                   board=Board([s.id for s, _ in cells]), resolver=BaseResolver(client, options),
                   requirements=RequirementsLookup(options.index_url, options.ca_bundle),
                   redact=(*_secrets_to_redact(), *options.cache_secrets()), locks=locks)
        run.container_labels = {docker_engine.RUN_LABEL: run.run_id, **dict(options.labels)}
        records, signum = _run_all(run, cells, progress)
    interrupted = signum is not None
    summary = BuildSummary(tuple(records), builder, round(time.monotonic() - started, 2), interrupted,
                           warnings=tuple(dict.fromkeys(run.warnings)))
    if progress:
        from rich.console import Console
        console = Console(stderr=True)
        console.print(summary_table(summary, console.width))
    if interrupted:
        counts = ", ".join(f"{summary.count(s)} {s.value}" for s in BuildStatus if summary.count(s))
        raise Interrupted(f"build interrupted ({counts}); finished records are in {Path(options.out_dir) / 'builds'}",
                          signum=signum)
    return summary


def choose_builder(wanted: Builder) -> str:
    """``buildkit`` or ``classic`` for the requested builder (auto: buildx when it works)."""
    available = docker_engine.buildx_available()
    if wanted is Builder.BUILDX and not available:
        raise HostError("--builder buildx: `docker buildx version` does not work on this machine",
                        remedy="install the buildx CLI plugin (scripts/setup-engine.sh) or use --builder classic")
    if wanted is Builder.CLASSIC:
        return "classic"
    return "buildkit" if available else "classic"


# ------------------------------------------------------------------------------------------ the run


def _run_all(run: _Run, cells: Sequence[BuildCell], progress: bool) -> tuple[list[BuildRecord], int | None]:
    """Run the workers; on Ctrl-C stop them and tidy up.

    Returns (records in input order, the interrupting signal or None when the run was not interrupted).
    """
    results: dict[str, BuildRecord] = {}
    view = ProgressView(run.board) if progress else None
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=run.options.jobs, thread_name_prefix="sf-build")
    futures = {pool.submit(_build_one, run, stack, derived): stack for stack, derived in cells}
    signum = None
    try:
        if view:
            view.start()
        _wait_all(futures, results, view)
    except KeyboardInterrupt as exc:
        signum = interrupt_signal(exc)
        run.cancel.cancel()
        _wait_all(futures, results, view)   # workers return quickly once cancelled
        docker_engine.remove_run_containers(run.client, run.run_id)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        if view:
            view.stop()
    ordered = [results.get(s.id) or _not_started(s, d) for s, d in cells]
    return ordered, signum


def _wait_all(futures: dict[concurrent.futures.Future[BuildRecord], Stack], results: dict[str, BuildRecord],
              view: ProgressView | None) -> None:
    pending = [f for f in futures if futures[f].id not in results]
    # Waking every tick keeps the main thread responsive to signals and the progress view fresh.
    for future in runner.finished_futures(pending, on_tick=view.refresh if view else None):
        if not future.cancelled():
            results[futures[future].id] = future.result()


def _not_started(stack: Stack, derived: Derived) -> BuildRecord:
    """A stack the run never reached (interrupted first); no record file is written for it."""
    return BuildRecord(stack_id=stack.id, stack=stack.to_json(), derived=derived.to_json(),
                       status=BuildStatus.SKIPPED, reason="not started: the run was interrupted",
                       created_at=utc_now(), stackforge_version=__version__)


def _build_one(run: _Run, stack: Stack, derived: Derived) -> BuildRecord:
    """One stack through every phase; never raises (the status says what happened)."""
    if run.cancel.requested:
        return _not_started(stack, derived)
    # Another run building this stack into the same --out goes first: its record, then ours.
    with stack_claim(run.options.out_dir, stack.id, cancel=run.cancel, holder=run.run_id,
                     tell=lambda line: print(f"{stack.id}: {line}", file=sys.stderr, flush=True)) as ours:
        if not ours:
            return _not_started(stack, derived)
        record = _build_claimed(run, stack, derived)
        if record.status is not BuildStatus.SKIPPED:
            write_record(run.options.out_dir, record)
    run.board.update(stack.id, phase="", status=record.status.value, done=True)
    return record


def _build_claimed(run: _Run, stack: Stack, derived: Derived) -> BuildRecord:
    stack_build = _StackBuild(run, stack, derived)
    run.board.update(stack.id, phase="base")
    try:
        return stack_build.execute()
    except _Stop as stop:
        return stack_build.record(stop.status, stop.reason)
    except StackforgeError as exc:
        return stack_build.record(BuildStatus.FAILED, exc.one_line())
    except Exception as exc:  # noqa: BLE001 - one stack's bug must not take the others down
        stack_build.log(traceback.format_exc())
        return stack_build.record(BuildStatus.FAILED, f"internal error: {type(exc).__name__}: {exc}")


class _Stop(Exception):
    """Ends a stack's build early with a status (failed / interrupted / cached)."""

    def __init__(self, status: BuildStatus, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class _StackBuild:
    """The phases of one stack's build, and what they found so far."""

    def __init__(self, run: _Run, stack: Stack, derived: Derived) -> None:
        self.run, self.stack, self.derived = run, stack, derived
        self.options = run.options
        self.log_path = log_path(self.options.out_dir, stack.id, run.run_id)
        self.durations: dict[str, float] = {}
        self.phase = "base"
        self.fields: dict[str, Any] = {}
        self.attempts = 0
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path.write_text(f"[stackforge] {utc_now()} building {stack.id}\n", encoding="utf-8")
        # The path only: the bundle itself never reaches a log.
        self.log(f"[stackforge] CA bundle: {self.options.ca_bundle or 'none'}")

    # -- bookkeeping

    def log(self, text: str) -> None:
        with runner.open_log(self.log_path) as log:
            runner.write_log(log, text if text.endswith("\n") else text + "\n")

    def enter(self, phase: str) -> float:
        if self.run.cancel.requested:
            # Before anything was built, the stack simply was not attempted (its old record stays).
            early = phase in ("base", "render")
            raise _Stop(BuildStatus.SKIPPED if early else BuildStatus.INTERRUPTED, f"interrupted before {phase}")
        self.phase = phase
        self.run.board.update(self.stack.id, phase=phase)
        self.log(f"[stackforge] phase {phase}")
        return time.monotonic()

    def took(self, phase: str, started: float) -> None:
        self.durations[phase] = round(self.durations.get(phase, 0.0) + time.monotonic() - started, 2)

    def record(self, status: BuildStatus, reason: str = "") -> BuildRecord:
        if reason:
            self.log(f"[stackforge] {status.value}: {reason}")
        return BuildRecord(stack_id=self.stack.id, stack=self.stack.to_json(), derived=self.derived.to_json(),
                           status=status, reason=reason,
                           phase="" if status in (BuildStatus.BUILT, BuildStatus.CACHED) else self.phase,
                           durations=dict(self.durations), log_path=str(self.log_path), attempts=self.attempts,
                           created_at=utc_now(), stackforge_version=__version__, **self.fields)

    # -- phases

    def execute(self) -> BuildRecord:
        base = self.resolve_base()
        composed = self.compose(base)
        resumed = self.resume(composed)
        if resumed is not None:
            return resumed
        previous = self.previous_record()
        previous_id = _image_id(self.run.client, composed.tag)
        body_id = self.build(composed)
        self.fields.update(body_image_id=body_id)
        reused = previous if previous is not None and _same_body(previous, body_id, self.options.verify) else None
        report = self.verify_inside(body_id, reused)
        freeze = self.freeze(body_id, report, reused)
        final_id = self.add_metadata(composed, base, body_id, freeze)
        self.fields.update(image_id=final_id)
        if report is not None:
            self.check_labels(composed, final_id, report)
        self.push(composed, final_id)
        image = self.run.client.images.get(final_id)
        self.fields.update(image_size=int(image.attrs.get("Size") or 0))
        if previous_id == final_id:
            return self.record(BuildStatus.CACHED, "every layer came from the cache (image id unchanged)")
        return self.record(BuildStatus.BUILT)

    def previous_record(self) -> BuildRecord | None:
        try:
            return read_record(self.options.out_dir, self.stack.id)
        except RecordError as exc:
            self.log(f"[stackforge] ignoring an unreadable previous record: {exc.one_line()}")
            return None

    def resolve_base(self) -> BaseImage:
        started = self.enter("base")
        base = self.run.resolver.resolve(self.stack, self.derived, self.log_path)
        if base.note:
            self.log(f"[stackforge] base: {base.note}")
        self.fields.update(base=base)
        self.took("base", started)
        return base

    def compose(self, base: BaseImage) -> Composed:
        started = self.enter("render")
        outcome = self.run.locks.get(self.stack.id)
        if outcome is not None:
            self.log(f"[stackforge] {outcome.line()}")
            self.fields.update(lock_sha256=outcome.lock.sha256(), lock_path=str(outcome.path))
            self.durations["lock"] = round(outcome.seconds, 2)
        declared, dropped = self.declared() if outcome is None else ((), ())
        options = self.options.compose_options(buildkit=self.run.builder == "buildkit", base_image=base.used,
                                               declared=declared,
                                               dropped_layers=dropped, wheelhouse_mount=self.run.named_contexts,
                                               lock=outcome.lock if outcome is not None else None)
        composed = compose_stack(self.stack, self.derived, options)
        write_context(composed, Path(self.options.out_dir) / "contexts" / self.stack.id)
        self.fields.update(image_tag=composed.tag, content_hash=composed.content_hash, builder=self.run.builder)
        self.took("render", started)
        return composed

    def declared(self) -> tuple[tuple[tuple[str, tuple[str, ...]], ...], tuple[str, ...]]:
        """What FlashInfer / SGLang declare they need (when the index says), and the layers dropped."""
        if not self.options.dependency_layers:
            return (), ()
        found, dropped = declared_for(self.stack, self.run.requirements, no_deps=frozenset(self.options.no_deps))
        if dropped:
            warning = dropped_warning(dropped, INLINE_DEPS_SUFFIX)
            self.log(f"[stackforge] render: warning: {warning}")
            self.run.warnings.append(warning)
        return found, tuple(d.layer for d in dropped)

    def resume(self, composed: Composed) -> BuildRecord | None:
        """--resume: the record says built and the image is still there with the same content hash."""
        if not self.options.resume:
            return None
        try:
            previous = read_record(self.options.out_dir, self.stack.id)
        except RecordError as exc:
            self.log(f"[stackforge] resume: ignoring unreadable record: {exc.one_line()}")
            return None
        if previous is None or not previous.status.ok or previous.content_hash != composed.content_hash:
            return None
        labels = _image_labels(self.run.client, composed.tag)
        if labels is None or labels.get("io.stackforge.content-hash") != composed.content_hash:
            return None
        self.log(f"[stackforge] resume: {composed.tag} exists with content hash {composed.hash12}; skipped")
        # This run's own log says what it did (the resume line above); the build's log stays where it was.
        return dataclasses.replace(previous, status=BuildStatus.CACHED, log_path=str(self.log_path),
                                   reason=f"--resume: {composed.tag} already built with the same content hash")

    def build(self, composed: Composed) -> str:
        started = self.enter("build")
        context = Path(self.options.out_dir) / "contexts" / self.stack.id
        try:
            for attempt in range(1, self.options.retries + 2):
                self.attempts = attempt
                result = self._attempt(composed, context)
                if result.ok and result.image_id:
                    return result.image_id
                self._after_failure(result, attempt)
        finally:
            self.took("build", started)
        raise AssertionError("unreachable: the last attempt either returns or raises")

    def _attempt(self, composed: Composed, context: Path) -> BuildAttempt:
        labels = list(self.options.labels)
        if self.run.builder == "buildkit":
            wheelhouse = self.options.find_links if self.run.named_contexts else None
            return buildkit.build(context, ca_bundle=self.options.ca_bundle,
                                  wheelhouse_context=wheelhouse, labels=labels, timeout=self.options.timeout_s,
                                  log_path=self.log_path, cancel=self.run.cancel, redact=self.run.redact,
                                  no_cache=self.options.no_cache,
                                  cache_from=_per_stack(self.options.cache_from, composed),
                                  cache_to=_per_stack(self.options.cache_to, composed),
                                  builder_name=self.options.builder_name, build_args=self._asset_args())
        return classic.build(self.run.client, context, labels=labels,
                             buildargs={**_proxy_values(), **self._asset_args()},
                             timeout=self.options.timeout_s, log_path=self.log_path, cancel=self.run.cancel,
                             redact=self.run.redact, no_cache=self.options.no_cache)

    def _asset_args(self) -> dict[str, str]:
        """The asset server's port, for the Dockerfile's build argument (none when no server runs)."""
        return {} if self.run.asset_port is None else {ASSET_PORT_ARG: str(self.run.asset_port)}

    def _after_failure(self, result: BuildAttempt, attempt: int) -> None:
        """Raise _Stop unless the failure is transient and attempts remain; then back off."""
        if self.run.cancel.requested:
            raise _Stop(BuildStatus.INTERRUPTED, "interrupted while building; the build process was stopped")
        if result.timed_out:
            note = backtracking_note(result.tail)
            raise _Stop(BuildStatus.FAILED, f"build {result.ending} (limit {self.options.timeout_s:.0f} s)"
                                            + (f" {note}" if note else ""))
        diagnosis = diagnose(result.tail)
        reason = diagnosis.line or result.ending
        if not diagnosis.retryable or attempt > self.options.retries:
            extra = f" after {attempt} attempts" if attempt > 1 else ""
            # One line: the cause, the log line that decided it, and the remedy.
            self.fields.update(cause=diagnosis.cause.value)
            raise _Stop(BuildStatus.FAILED, f"build {result.ending}{extra}: {diagnosis.one_line()}")
        wait = self.options.retry_backoff_s * 2 ** (attempt - 1)
        self.log(f"[stackforge] transient failure ({diagnosis.cause.value}: {reason}); "
                 f"retry {attempt + 1} in {wait:.0f} s")
        self.run.board.update(self.stack.id, phase=f"retry {attempt + 1}")
        if self.run.cancel.wait(wait):
            raise _Stop(BuildStatus.INTERRUPTED, "interrupted while waiting to retry")

    def verify_inside(self, body_id: str, reused: BuildRecord | None) -> ImageVerification | None:
        """Check the built image from the inside; None when verification is off.

        A body image identical to the one a previous record verified (same id: same content) keeps
        that verification instead of starting a container again.
        """
        if not self.options.verify:
            return None
        started = self.enter("verify")
        if reused is not None:
            self.log(f"[stackforge] verify: image {body_id[:19]} is the one verified before; reusing that")
            self.fields.update(verify=reused.verify, installed=reused.installed)
            self.took("verify", started)
            return None
        report = verify_image(self.run.client, body_id, self.stack, self.derived,
                              no_deps=frozenset(self.options.no_deps), labels=self.run.container_labels)
        self.took("verify", started)
        return report

    def freeze(self, body_id: str, report: ImageVerification | None, reused: BuildRecord | None) -> list[str]:
        """The image's resolved package set: from verification, a previous record, or a short container."""
        if report is not None:
            return list(report.freeze)
        if reused is not None and reused.freeze:
            return list(reused.freeze)
        started = self.enter("metadata")
        freeze = read_freeze(self.run.client, body_id, labels=list(self.run.container_labels.items()),
                             log_path=self.log_path)
        self.took("metadata", started)
        return freeze

    def add_metadata(self, composed: Composed, base: BaseImage, body_id: str, freeze: list[str]) -> str:
        started = self.enter("metadata")
        client = self.run.client
        created = str(client.images.get(body_id).attrs.get("Created", ""))
        labels = dynamic_labels(composed, base, freeze, created, self.options.labels)
        final_id = add_labels(client, body_id, composed.tag, labels, log_path=self.log_path)
        self.fields.update(freeze=list(freeze), provenance=provenance_note(self.run.builder))
        self.took("metadata", started)
        return final_id

    def check_labels(self, composed: Composed, final_id: str, report: ImageVerification) -> None:
        """Finish verification on the labelled image; a failed check fails the stack (image kept)."""
        started = self.enter("verify")
        report = report.with_check(label_check(self.run.client, final_id, composed.labels))
        outcome = self.run.locks.get(self.stack.id)
        if outcome is not None:
            report = report.with_check(lock_check(report.freeze, [p.pin() for p in outcome.lock.venv_packages]))
        self.fields.update(verify=report.to_json(), installed=dict(report.installed))
        for check in report.checks:
            self.log(f"[stackforge] verify {check.name}: {check.status.value} (expected {check.expected}, "
                     f"found {check.actual})")
        self.took("verify", started)
        if report.status is not Status.PASS:
            raise _Stop(BuildStatus.FAILED, f"verification failed: {report.summary()}")

    def push(self, composed: Composed, image_id: str) -> None:
        if not self.options.push:
            return
        started = self.enter("push")
        name, tag = composed.tag.rsplit(":", 1)
        try:
            pushed = registry.push(image_id, Repository.parse(f"{self.options.push.rstrip('/')}/{name}"), tag,
                                   timeout=self.options.timeout_s, log_path=self.log_path, redact=self.run.redact)
        except CommandError as exc:
            raise _Stop(BuildStatus.FAILED, exc.message + (f" (hint: {exc.remedy})" if exc.remedy else "")) from None
        finally:
            self.took("push", started)
        self.fields.update(repo_digest=pushed.ref)


# ------------------------------------------------------------------------------------------ helpers


def _per_stack(locations: Sequence[str], composed: Composed) -> list[str]:
    """Cache locations with ``{stack}`` replaced by the stack's image repository name."""
    return [location.replace("{stack}", composed.tag.split(":", 1)[0].removeprefix("stackforge/"))
            for location in locations]


def _unique(cells: Sequence[BuildCell]) -> list[BuildCell]:
    seen: dict[str, BuildCell] = {}
    for stack, derived in cells:
        if stack.id in seen and seen[stack.id] != (stack, derived):
            raise SpecError(f"two different stacks share the id {stack.id}")
        seen.setdefault(stack.id, (stack, derived))
    return list(seen.values())


def _check_inputs(options: BuildOptions) -> None:
    if options.find_links is not None and not Path(options.find_links).is_dir():
        raise SpecError(f"--find-links {options.find_links}: not a directory")
    if options.ca_bundle is not None:
        path = Path(options.ca_bundle)
        if not path.is_file() or path.stat().st_size == 0:
            raise SpecError(f"--ca-bundle {path}: not a readable, non-empty file")
        if b"-----BEGIN CERTIFICATE-----" not in path.read_bytes():
            raise SpecError(f"--ca-bundle {path}: no PEM certificate in it")


class _NoServer:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


class _Serving:
    def __init__(self, server: AssetServer) -> None:
        self.server = server

    def __enter__(self) -> int:
        self.server.__enter__()
        return self.server.port

    def __exit__(self, *exc: object) -> None:
        self.server.close()


def _asset_server(options: BuildOptions, builder: str, named_contexts: bool) -> _NoServer | _Serving:
    """The 127.0.0.1 asset server, for what a build cannot mount.

    Classic builds fetch the CA bundle and the wheelhouse from it. BuildKit gets the CA as a secret;
    it fetches the wheelhouse from the server only when the engine has no named build contexts (a
    wheelhouse put into each stack's build context would be checksummed and sent again per stack:
    gigabytes with real CUDA wheels).
    """
    if builder == "classic" and (options.ca_bundle is not None or options.find_links is not None):
        return _Serving(AssetServer(ca_bundle=options.ca_bundle, wheelhouse=options.find_links))
    if builder == "buildkit" and options.find_links is not None and not named_contexts:
        return _Serving(AssetServer(ca_bundle=None, wheelhouse=options.find_links))
    return _NoServer()


def _proxy_values() -> dict[str, str]:
    return {name: os.environ[name] for name in buildkit.proxy_build_args(os.environ)}


def _secrets_to_redact() -> tuple[str, ...]:
    """Proxy URLs may carry credentials; they never reach a log."""
    return tuple(value for value in _proxy_values().values() if "@" in value)


def _image_id(client: docker.DockerClient, ref: str) -> str | None:
    try:
        return str(client.images.get(ref).id)
    except docker.errors.ImageNotFound:
        return None


def _image_labels(client: docker.DockerClient, ref: str | None) -> dict[str, str] | None:
    if not ref:
        return None
    try:
        return dict(client.images.get(ref).labels or {})
    except docker.errors.ImageNotFound:
        return None


def _same_body(previous: BuildRecord, body_id: str, verify: bool) -> bool:
    """The previous record is about this very image (same id) and found what is needed to reuse it."""
    if previous.body_image_id != body_id or not previous.status.ok or not previous.freeze:
        return False
    return not verify or previous.verify.get("status") == Status.PASS.value
