"""Tests for stackforge.core.shard: parsing, and the split properties over many random id sets."""

from __future__ import annotations

import os
import random
import string
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from stackforge.core.errors import SpecError
from stackforge.core.model import Stack
from stackforge.core.shard import Shard, click_shard_option, nonempty_shards, select, shard_index, split


def _random_ids(rng: random.Random, count: int) -> list[str]:
    alphabet = string.ascii_lowercase + string.digits + ".-+"
    return list({"".join(rng.choices(alphabet, k=rng.randint(1, 40))) for _ in range(count)})


# ------------------------------------------------------------------------------------------------- parsing


@pytest.mark.parametrize("text, expected", [("1/1", Shard(1, 1)), ("2/4", Shard(2, 4)), (" 3 / 3 ", Shard(3, 3)),
                                            ("10/12", Shard(10, 12))])
def test_parse_accepts_k_of_n(text: str, expected: Shard) -> None:
    assert Shard.parse(text) == expected


@pytest.mark.parametrize("text, needle", [
    ("0/3", "K must be between 1 and 3"),
    ("4/3", "K must be between 1 and 3"),
    ("1/0", "shard count must be between 1"),
    ("a/b", "not of the form K/N"),
    ("1/", "not of the form K/N"),
    ("/3", "not of the form K/N"),
    ("-1/3", "not of the form K/N"),
    ("1.5/3", "not of the form K/N"),
    ("1/3/5", "not of the form K/N"),
    ("", "not of the form K/N"),
    ("1/100000", "shard count must be between 1"),
])
def test_parse_rejects_bad_input_with_a_clear_spec_error(text: str, needle: str) -> None:
    with pytest.raises(SpecError) as info:
        Shard.parse(text)
    assert needle in str(info.value)


def test_constructor_validates_and_rejects_bools() -> None:
    with pytest.raises(SpecError):
        Shard(True, 2)
    with pytest.raises(SpecError):
        Shard(0, 2)


def test_str_and_slug_round_trip() -> None:
    shard = Shard(2, 4)
    assert str(shard) == "2/4"
    assert shard.slug == "2-of-4"
    assert Shard.parse(str(shard)) == shard


def test_shard_is_frozen_and_hashable() -> None:
    shard = Shard(1, 2)
    with pytest.raises(AttributeError):
        shard.index = 2  # type: ignore[misc]
    assert {shard, Shard(1, 2)} == {shard}


# --------------------------------------------------------------------------------------------- properties


def test_shards_partition_every_random_id_set() -> None:
    """Union of the N shards is the whole set; no id is in two shards; order is kept."""
    rng = random.Random(20261129)
    for _ in range(300):
        ids = _random_ids(rng, rng.randint(0, 60))
        total = rng.randint(1, 9)
        shards = [select(ids, shard, key=str) for shard in Shard.all_of(total)]
        flat = [item for part in shards for item in part]
        assert sorted(flat) == sorted(ids), "union must be the whole set, without duplicates"
        assert len(flat) == len(set(flat))
        for part in shards:
            assert list(part) == [i for i in ids if i in set(part)], "a shard keeps the input order"
        assert tuple(shards) == split(ids, total, key=str)


def test_membership_depends_on_the_id_alone() -> None:
    """Adding or removing other ids never moves an id to another shard."""
    rng = random.Random(7)
    for _ in range(100):
        ids = _random_ids(rng, 40)
        total = rng.randint(2, 8)
        subset = rng.sample(ids, k=len(ids) // 2)
        for shard in Shard.all_of(total):
            assert set(select(subset, shard, key=str)) == set(select(ids, shard, key=str)) & set(subset)


def test_split_is_roughly_balanced_on_large_sets() -> None:
    rng = random.Random(3)
    ids = _random_ids(rng, 4000)
    for total in (2, 3, 4, 8):
        sizes = [len(part) for part in split(ids, total, key=str)]
        expected = len(ids) / total
        assert all(abs(size - expected) < 0.15 * expected for size in sizes), sizes


def test_assignment_is_stable_across_processes_with_different_hash_seeds() -> None:
    """The split must not use Python's salted hash(): two CI jobs must agree."""
    ids = [f"cu131-torch2.14.{n}-fi0.7.2-sgl0.5.23-py312" for n in range(30)]
    code = ("import sys; from stackforge.core.shard import shard_index; "
            "print(','.join(str(shard_index(i, 5)) for i in sys.argv[1:]))")
    answers = set()
    for seed in ("1", "2", "random"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run([sys.executable, "-c", code, *ids], env=env, capture_output=True, text=True,
                             check=True, timeout=60)
        answers.add(out.stdout.strip())
    assert answers == {",".join(str(shard_index(i, 5)) for i in ids)}


def test_known_assignments_never_change() -> None:
    """Pinned values: changing the hash would silently reshuffle every user's CI shards.

    Cross-checked outside Python: ``printf %s a | sha256sum`` -> first 16 hex digits, mod 4, plus 1.
    """
    assert [shard_index(k, 4) for k in ("a", "b", "cu131-torch2.14.1-fi0.7.2-sgl0.5.23-py312")] == [3, 3, 1]


def test_select_uses_stack_id_by_default_and_none_means_all() -> None:
    stacks = [Stack(cuda="13.1", torch=f"2.14.{n}", flashinfer="0.7.2", sglang="0.5.23", python="3.12")
              for n in range(12)]
    assert select(stacks, None) == tuple(stacks)
    assert select(stacks, Shard(1, 1)) == tuple(stacks)
    for shard in Shard.all_of(3):
        assert all(shard_index(s.id, 3) == shard.index for s in select(stacks, shard))


def test_nonempty_shards_lists_exactly_the_shards_with_work() -> None:
    rng = random.Random(11)
    for _ in range(100):
        ids = _random_ids(rng, rng.randint(0, 6))
        total = rng.randint(1, 8)
        expected = tuple(s for s in Shard.all_of(total) if select(ids, s, key=str))
        assert nonempty_shards(ids, total) == expected


# -------------------------------------------------------------------------------------------------- click


def _shard_cli() -> click.Command:
    @click.command()
    @click_shard_option()
    def command(shard: Shard | None) -> None:
        click.echo(repr(shard))

    return command


def test_click_option_converts_to_a_shard() -> None:
    result = CliRunner().invoke(_shard_cli(), ["--shard", "2/4"])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == "Shard(index=2, total=4)"
    assert CliRunner().invoke(_shard_cli(), []).output.strip() == "None"


def test_click_option_turns_bad_values_into_a_usage_error() -> None:
    result = CliRunner().invoke(_shard_cli(), ["--shard", "4/3"])
    assert result.exit_code == 2
    assert "shard 4/3 does not exist" in result.output
