"""The watch report for a person (text), a pull request (markdown) and a program (json).

The answer first: which releases are new and whether any reading, rule or stack moved; then per
release the readings that changed with the code on both sides, the rules read again (and the proposed
patches), the dead ends it unblocks, what a new SGLang release's own pins change
(:mod:`stackforge.wheels.pin_effects`), and the lock diff. Evidence is complete in json and markdown
(markdown folds it under ``<details>``); the text shows one line per change and the patches.
"""

from __future__ import annotations

from typing import Any

from stackforge.core.wheel_readings import CodeSite
from stackforge.core.markdown import md_document
from stackforge.wheels.bisect import site_text
from stackforge.wheels.tier import Measurement
from stackforge.watch.campaign import NewRelease, ReadingComparison, WatchReport

WATCH_SCHEMA = "stackforge.watch/1"


def headline(report: WatchReport) -> str:
    """One line: what is new, and what it changed."""
    if not report.releases:
        return "nothing new on the index" + (f" since {_baseline_words(report)}" if _baseline_words(report) else "")
    changed = sum(len(r.changed) for r in report.releases)
    wrong = sum(len(r.patches) for r in report.releases)
    unblocked = sum(1 for r in report.releases for c in r.changed if c.unblocks)
    moved = len(report.lock.changes) if report.lock else 0
    names = ", ".join(f"{r.dist} {r.version}" + (" (yanked)" if r.yanked else "") for r in report.releases)
    return (f"{len(report.releases)} new release(s): {names}; {changed} verdict(s) changed, {unblocked} dead end(s) "
            f"unblocked, {wrong} rule(s) no longer hold, {moved} lock change(s)")


def _baseline_words(report: WatchReport) -> str:
    return ", ".join(f"{dist} {version}" for dist, version in report.baseline.items() if version)


# --------------------------------------------------------------------------- json

def report_json(report: WatchReport) -> dict[str, Any]:
    return {"schema": WATCH_SCHEMA, "checked_at": report.checked_at, "index": report.index, "matrix": report.matrix,
            "targets": list(report.targets), "replay": report.replay, "seconds": report.seconds,
            "headline": headline(report), "baseline": report.baseline,
            "newest": {dist: seen.to_json() for dist, seen in report.newest.items()},
            "releases": [_release_json(r) for r in report.releases], "notes": list(report.notes),
            "lock": None if report.lock is None else {
                "path": str(report.lock.path), "changes": list(report.lock.changes), "notes": list(report.lock.notes),
                "resolved": report.lock.lock.to_json()}}


def _release_json(release: NewRelease) -> dict[str, Any]:
    return {"package": release.dist, "version": release.version, "uploaded": release.uploaded,
            "previous": release.previous, "yanked": release.yanked, "unread": release.unread,
            "changed": [_comparison_json(c) for c in release.changed],
            "unchanged": [_comparison_json(c) for c in release.comparisons
                          if not c.changed and not c.no_longer_decided],
            "no_longer_decided": [_comparison_json(c) for c in release.comparisons if c.no_longer_decided],
            "unblocks": [f"{c.feature} on {c.target}" for c in release.changed if c.unblocks],
            "blocks": [f"{c.feature} on {c.target}" for c in release.changed if c.blocks],
            "rules": [{**r.check.to_json(), "patch": r.patch.to_json() if r.patch else None} for r in release.rules],
            "missing_pins": release.pins,
            "pin_effects": release.pin_effects.to_json() if release.pin_effects is not None else None,
            "proposed_patches": [p.to_json() for p in release.patches]}


def _comparison_json(comparison: ReadingComparison) -> dict[str, Any]:
    return {"fact": comparison.fact, "feature": comparison.feature, "target": comparison.target,
            "contexts": list(comparison.contexts),
            "before": _measurement_json(comparison.before), "after": _measurement_json(comparison.after)}


def _measurement_json(measurement: Measurement | None) -> dict[str, Any] | None:
    if measurement is None:
        return None
    reading, file = measurement.reading, measurement.file
    return {"version": measurement.version, "status": reading.status.value, "manner": reading.manner,
            "summary": reading.summary, "sites": [_site_json(s) for s in reading.sites],
            "file": None if file is None else {"filename": file.filename, "url": file.url, "sha256": file.sha256}}


def _site_json(site: CodeSite) -> dict[str, Any]:
    return {"path": site.path, "line": site.line, "code": site.code}


# --------------------------------------------------------------------------- text

def report_text(report: WatchReport) -> str:
    lines = [headline(report), f"  read {report.checked_at} from {report.index} for {', '.join(report.targets)} "
                               f"({report.matrix}); {report.seconds:.1f} s"]
    for release in report.releases:
        lines += ["", _release_heading(release)]
        if release.unread:
            lines.append(f"  {release.unread}")
            continue
        lines += [f"  changed: {_change_line(c)}" for c in release.changed]
        unchanged = [c for c in release.comparisons if not c.changed and not c.no_longer_decided]
        if unchanged:
            lines.append(f"  unchanged: {len(unchanged)} reading(s) "
                         f"({', '.join(sorted({c.fact for c in unchanged}))})")
        lines += [f"  {line}" for line in _consequences(release)]
        for recheck in release.rules:
            check = recheck.check
            lines.append(f"  rule {check.rule_id}: {check.result.value.upper()} ({check.bound}): {check.why}")
            if recheck.patch is not None:
                lines.append(f"    proposed: {recheck.patch.summary}")
                lines += [f"    {line}" for line in recheck.patch.diff.splitlines()]
    if report.lock is not None:
        lines += ["", "lock: " + ("; ".join(report.lock.changes) or f"{report.lock.path.name} unchanged")]
        lines += [f"  note: {n}" for n in report.lock.notes]
    if report.notes:
        lines += ["", *(f"note: {n}" for n in report.notes)]
    return "\n".join(lines)


def _consequences(release: NewRelease) -> list[str]:
    """What the release means beyond its readings: dead ends it opens or closes, pins the repository lacks."""
    lines = [f"unblocks {c.feature} on {c.target}: admitted by the code in {release.version}, not measured working "
             "(stackforge probe confirms)" for c in release.changed if c.unblocks]
    lines += [f"no longer decided: {c.fact} on {c.target}: {c.after.reading.summary[:120]} (the reader needs a look)"
              for c in release.comparisons if c.no_longer_decided]
    lines += [f"now refuses {c.feature} on {c.target}" for c in release.changed if c.blocks]
    if release.pins is not None:
        lines.append(_pins_words(release))
    if release.pin_effects is not None:   # the release judged by its own pins, per target, CUDA and flavour
        lines += release.pin_effects.lines()
    return lines


def _pins_words(release: NewRelease) -> str:
    pins = ", ".join(f"{k} {v}" for k, v in (release.pins or {}).items())
    return (f"compat/sglang_pins.yaml has no row for sglang {release.version} ({pins}): "
            "`stackforge compat pins --write` adds it")


def _release_heading(release: NewRelease) -> str:
    since = f" (after {release.previous})" if release.previous else ""
    uploaded = f", uploaded {release.uploaded}" if release.uploaded else ""
    return f"{release.dist} {release.version}{since}{uploaded}" + (" [yanked]" if release.yanked else "")


def _change_line(comparison: ReadingComparison) -> str:
    before, after = comparison.before, comparison.after
    return (f"{comparison.fact} on {comparison.target}: {_reading_words(before)} -> {_reading_words(after)} "
            f"[{_first_site(after) or _first_site(before)}]")


def _reading_words(measurement: Measurement | None) -> str:
    if measurement is None:
        return "none"
    reading = measurement.reading
    return f"{measurement.version} {reading.status.value}" + (f" ({reading.manner})" if reading.manner else "")


def _first_site(measurement: Measurement | None) -> str:
    if measurement is None or not measurement.reading.sites:
        return ""
    return site_text(measurement.reading.sites[0])[:100]


# --------------------------------------------------------------------------- markdown

def report_markdown(report: WatchReport) -> str:
    """For a pull request or a job summary: the answer, then each release with its evidence folded."""
    lines = [f"## stackforge watch: {headline(report)}", "",
             f"Read {report.checked_at} from `{report.index}` for {', '.join(f'`{t}`' for t in report.targets)}.", ""]
    for release in report.releases:
        lines += [f"### {_release_heading(release)}", ""]
        if release.unread:
            lines += [release.unread[:1].upper() + release.unread[1:], ""]
            continue
        if release.changed:
            lines += ["| fact | target | before | after |", "|---|---|---|---|"]
            lines += [f"| `{c.fact}` | {c.target} | {_reading_words(c.before)} | {_reading_words(c.after)} |"
                      for c in release.changed]
            lines.append("")
            for c in release.changed:
                lines += [f"<details><summary>{c.fact} on {c.target}: the code on both sides</summary>", "", "```"]
                for measurement in (c.before, c.after):
                    if measurement is not None:
                        lines.append(f"{measurement.version}: {measurement.reading.status.value}: "
                                     f"{measurement.reading.summary}")
                        lines += [f"  {site_text(s)}" for s in measurement.reading.sites]
                        if measurement.file is not None:
                            lines.append(f"  {measurement.file.kind}: {measurement.file.url} "
                                         f"sha256:{measurement.file.sha256}")
                lines += ["```", "</details>", ""]
        else:
            lines += [f"No verdict changed ({len(release.comparisons)} reading(s) compared).", ""]
        # A consequence's own sub-list ("  - ", the pin effects) stays nested under its item.
        lines += [line if line.startswith("  - ") else f"- {line}" for line in _consequences(release)]
        for recheck in release.rules:
            v = recheck.check
            lines.append(f"- rule `{v.rule_id}` ({v.bound}): **{v.result.value}**: {v.why}")
            if recheck.patch is not None and recheck.patch.diff:
                lines += ["", f"  Proposed: {recheck.patch.summary}", "", "```diff", recheck.patch.diff.rstrip(), "```"]
            elif recheck.patch is not None:
                lines += ["", f"  Proposed: {recheck.patch.summary}"]
        lines.append("")
    if report.lock is not None:
        lines += ["### Lock", "", *([f"- {c}" for c in report.lock.changes] or ["- unchanged"]), ""]
    if report.notes:
        lines += ["### Notes", "", *(f"- {n}" for n in report.notes), ""]
    return md_document("\n".join(lines))   # record and reading text made inert: no raw HTML, no javascript:
