"""The search for where a verdict changes (pure: a callback stands for reading a wheel)."""

from __future__ import annotations

from dataclasses import dataclass

from stackforge.core.wheel_readings import Reading, ReadingStatus
from stackforge.wheels.bisect import binary_search, full_scan

A, U, X, D = (ReadingStatus.AVAILABLE, ReadingStatus.UNAVAILABLE, ReadingStatus.ABSENT, ReadingStatus.UNDECIDED)


@dataclass(frozen=True)
class Read:
    reading: Reading


def history(statuses):
    versions = [f"0.{i}" for i in range(len(statuses))]
    calls: list[str] = []

    def read(version: str) -> Read:
        calls.append(version)
        return Read(Reading("f", statuses[versions.index(version)], version))
    return versions, read, calls


def boundaries(search):
    return [(c.before.version, c.after.version, [p.version for p in c.undecided]) for c in search.changes]


def test_one_change_is_found_with_few_reads():
    statuses = [U] * 60 + [A] * 40
    versions, read, calls = history(statuses)
    search = binary_search(versions, read)
    assert boundaries(search) == [("0.59", "0.60", [])]
    assert len(calls) <= 10 and len(set(calls)) == len(calls), "each release is read at most once"
    assert not search.exhaustive


def test_the_change_at_either_end():
    for statuses, expected in (([U] + [A] * 9, ("0.0", "0.1")), ([U] * 9 + [A], ("0.8", "0.9"))):
        versions, read, _ = history(statuses)
        assert boundaries(binary_search(versions, read)) == [(*expected, [])]


def test_undecided_releases_are_stepped_over_and_named():
    statuses = [U] * 10 + [D, D] + [A] * 10
    versions, read, _ = history(statuses)
    assert boundaries(binary_search(versions, read)) == [("0.9", "0.12", ["0.10", "0.11"])]


def test_ends_that_agree_are_sampled_between():
    statuses = [A] * 10 + [U] * 30 + [A] * 20   # no gate, then a gate without the arch, then with it
    versions, read, _ = history(statuses)
    assert boundaries(binary_search(versions, read)) == [("0.9", "0.10", []), ("0.39", "0.40", [])]


def test_ends_that_agree_with_nothing_between_report_no_change():
    versions, read, calls = history([A] * 30)
    search = binary_search(versions, read)
    assert search.changes == () and len(calls) == 8


def test_three_verdicts_in_a_row():
    statuses = [X] * 7 + [U] * 7 + [A] * 7
    versions, read, _ = history(statuses)
    assert boundaries(binary_search(versions, read)) == [("0.6", "0.7", []), ("0.13", "0.14", [])]


def test_full_scan_reports_a_history_that_is_not_monotone():
    statuses = [U, U, A, A, U, A, D, A, U]
    versions, read, calls = history(statuses)
    search = full_scan(versions, read)
    assert calls == versions and search.exhaustive
    assert boundaries(search) == [("0.1", "0.2", []), ("0.3", "0.4", []), ("0.4", "0.5", []),
                                  ("0.7", "0.8", [])]


def test_no_release_and_one_release():
    assert binary_search([], lambda v: None).changes == ()
    versions, read, _ = history([A])
    search = binary_search(versions, read)
    assert [p.version for p in search.points] == ["0.0"] and search.changes == ()


def test_leading_releases_that_cannot_be_decided_do_not_widen_the_search():
    statuses = [D] * 5 + [U] * 40 + [A] * 20
    versions, read, calls = history(statuses)
    search = binary_search(versions, read)
    assert boundaries(search) == [("0.44", "0.45", [])]
    assert len(calls) <= 5 + 8, "the ends are the first and last decided releases: no sampling"


def test_nothing_decidable():
    versions, read, calls = history([D] * 4)
    search = binary_search(versions, read)
    assert search.changes == () and len(search.undecided) == 4 and calls == versions


def test_the_same_status_reached_another_way_is_a_change():
    versions = [f"0.5.{i}" for i in range(20)]

    def read(version: str) -> Read:
        index = versions.index(version)
        manner = "raises KeyError" if index < 14 else "disabled"
        return Read(Reading("torch-symm-mem", U, version, manner=manner))
    search = binary_search(versions, read)
    assert boundaries(search) == [("0.5.13", "0.5.14", [])]
    assert search.changes[0].after.verdict_text == "unavailable: disabled"
