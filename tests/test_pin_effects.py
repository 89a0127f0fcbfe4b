"""A release judged by its own pins (issue #33 item 3): what SGLang's Requires-Dist of torch, FlashInfer and the
kernel change, per target, CUDA version and flavour, in the watch report and in ``bisect --through-pins``.

The fast tests use the shipped rules and compat/sglang_pins.yaml with stub readings (no network); the last
one reads the real index."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from stackforge.cli import cli
from stackforge.core.model import Flavour
from stackforge.core.wheel_readings import CodeSite, Reading, ReadingStatus
from stackforge.plan.planner import load_knowledge
from stackforge.plan.rules import FEATURES
from stackforge.watch.campaign import NewRelease, WatchReport
from stackforge.watch.report import report_json, report_markdown, report_text
from stackforge.wheels.bisect import binary_search, full_scan
from stackforge.wheels.pin_effects import (
    PINNED_DISTS,
    Judge,
    compare_pins,
    judge_through_pins,
    newest_admitting,
    slots_for,
    write_pin_search,
)
from stackforge.wheels.tier import load_readers

TARGET = "rtx-pro-6000-x8-pcie"
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def knowledge():
    return load_knowledge()


def _stub_read(spec, version, ctx):
    """FlashInfer's SM12x CUDA-version gate as the real wheels read: from 0.6.7 to 0.7.0.post1 it refuses CUDA
    12.8 (nvcc's, else torch's); every other reading is undecided (it decides nothing here)."""
    if spec.fact != "flashinfer-jit":
        return SimpleNamespace(reading=Reading(spec.fact, ReadingStatus.UNDECIDED, "stub"))
    from packaging.version import Version
    cuda = ctx.cuda if ctx.nvcc else ctx.torch_cuda
    refused = Version("0.6.7") <= Version(version) < Version("0.7.1") and Version(cuda) < Version("12.9")
    site = CodeSite("flashinfer/compilation_context.py", 52, 'raise RuntimeError("SM 12.x requires CUDA >= 12.9")')
    return SimpleNamespace(reading=Reading(spec.fact, ReadingStatus.UNAVAILABLE if refused else ReadingStatus.AVAILABLE,
                                           "stub gate", (site,) if refused else ()))


def _effects(knowledge, sglang, previous, cudas=("12.8",)):
    pins = knowledge.tables.sglang_pins
    judge = Judge(knowledge, _stub_read, load_readers(), dists=PINNED_DISTS)
    slots = slots_for([knowledge.targets[TARGET]], cudas)
    return compare_pins(sglang, pins[sglang], previous, pins[previous], slots, judge, FEATURES,
                        {r.id: r for r in knowledge.rules})


def test_sglang_0_5_10_pins_lose_flashinfer_jit_on_sm120_with_cuda_12_8_per_flavour(knowledge):
    effects = _effects(knowledge, "0.5.10", "0.5.9")
    assert "flashinfer 0.6.7.post2 (was 0.6.3)" in effects.moves
    jit = {c.slot.flavour: c for c in effects.changes if c.feature == "flashinfer-jit"}
    devel = jit[Flavour.DEVEL]
    assert (devel.before.status, devel.after.status) == ("admitted", "unavailable")
    assert devel.after.rules == ("flashinfer-sm120-needs-cuda129-nvcc",)
    text = "\n".join(effects.lines())
    assert ("sglang 0.5.10 pins flashinfer 0.6.7.post2 (was 0.6.3)" in text and
            f"flashinfer-jit on {TARGET} with CUDA 12.8 (devel) becomes unavailable "
            "(rule flashinfer-sm120-needs-cuda129-nvcc" in text)
    # The wheels flavour has no nvcc (no JIT at all), and still its pinned FlashInfer's gate moved: reported.
    wheels = jit[Flavour.WHEELS]
    assert (wheels.before.status, wheels.after.status) == ("unavailable", "unavailable")
    assert "flashinfer-sm120-needs-cuda129-torch-fallback" in wheels.after.rules
    assert f"flashinfer-jit on {TARGET} with CUDA 12.8 (wheels) stays unavailable, its evidence moves" in text


def test_a_release_that_keeps_its_pins_moves_nothing(knowledge):
    # 0.5.10.post1 changes only FlashInfer's post release (0.6.7.post2 -> .post3): judged, nothing moves.
    effects = _effects(knowledge, "0.5.10.post1", "0.5.10")
    assert effects.moves == ("flashinfer 0.6.7.post3 (was 0.6.7.post2)",)
    assert effects.changes == ()
    assert "no feature moves in 2 slot(s)" in effects.lines()[0]


def test_a_change_the_release_makes_by_its_own_version_is_not_a_pin_effect(knowledge):
    # 0.5.10 also admits trtllm_mha decode on SM120 (a rule on sglang's version alone): the watch's code
    # comparison reports that, the pins do not.
    effects = _effects(knowledge, "0.5.10", "0.5.9")
    assert not [c for c in effects.changes if c.feature.startswith("sglang-trtllm")]


def test_a_stack_the_new_pins_cannot_make_is_one_line_per_slot(knowledge):
    effects = _effects(knowledge, "0.5.11", "0.5.10.post1")
    stack = [c for c in effects.changes if c.feature == "the stack"]
    assert {c.slot.flavour for c in stack} == {Flavour.DEVEL, Flavour.WHEELS}
    assert all(c.after.status == "pruned" and "sglang-cuda13-stack" in c.after.rules for c in stack)
    assert not [c for c in effects.changes if c.feature != "the stack"]


def _search(knowledge, flavour, search=binary_search):
    pins = knowledge.tables.sglang_pins
    judge = Judge(knowledge, _stub_read, load_readers())
    (slot,) = slots_for([knowledge.targets[TARGET]], ("12.8",), flavours=(flavour,))
    versions = list(pins)
    return slot, search(versions, lambda v: judge_through_pins(v, pins[v], slot, judge, "flashinfer-jit"))


def test_through_pins_the_newest_sglang_keeping_flashinfer_jit_with_cuda_12_8_is_0_5_9(knowledge):
    slot, search = _search(knowledge, Flavour.DEVEL)
    assert newest_admitting(search.points) == ("0.5.9", True)
    assert ("0.5.9", "0.5.10") in [(c.before.version, c.after.version) for c in search.changes]
    assert len(search.points) < len(search.versions) / 2        # a search, not a scan
    text = write_pin_search(search, feature="flashinfer-jit", slot=slot)
    assert "newest sglang whose own pins keep flashinfer-jit admitted: 0.5.9 (torch 2.9.1, flashinfer 0.6.3" in text
    assert "pins: flashinfer 0.6.7.post2 (was 0.6.3)" in text
    # The full scan agrees with the search.
    assert newest_admitting(_search(knowledge, Flavour.DEVEL, full_scan)[1].points) == ("0.5.9", True)


def test_through_pins_the_wheels_flavour_shows_the_gate_moving_behind_its_missing_nvcc(knowledge):
    slot, search = _search(knowledge, Flavour.WHEELS, full_scan)
    assert newest_admitting(search.points) == (None, False)
    change = next(c for c in search.changes if c.after.version == "0.5.10")
    assert "flashinfer-sm120-needs-cuda129-torch-fallback" in change.after.result.judgement.rules
    assert "no release read keeps flashinfer-jit admitted" in write_pin_search(search, feature="flashinfer-jit",
                                                                                slot=slot)


def test_the_watch_report_carries_the_pin_effects(knowledge):
    effects = _effects(knowledge, "0.5.10", "0.5.9")
    release = NewRelease("sglang", "0.5.10", "2026-04-01T00:00:00Z", "0.5.9", pin_effects=effects)
    report = WatchReport("2026-12-05T00:00:00Z", "https://pypi.org/simple", "default", (TARGET,), {"sglang": "0.5.9"},
                         {}, (release,))
    assert "flashinfer-jit on rtx-pro-6000-x8-pcie with CUDA 12.8 (devel) becomes unavailable" in report_text(report)
    assert "sglang 0.5.10 pins flashinfer 0.6.7.post2 (was 0.6.3)" in report_markdown(report)
    data = report_json(report)["releases"][0]["pin_effects"]
    jit = [c for c in data["changes"] if c["feature"] == "flashinfer-jit" and c["flavour"] == "devel"]
    assert jit[0]["after"]["rules"] == ["flashinfer-sm120-needs-cuda129-nvcc"]


@pytest.mark.parametrize("args, message", [
    (["--package", "flashinfer-python", "--through-pins", "--cuda", "12.8"], "add --package sglang"),
    (["--package", "sglang", "--through-pins"], "add --cuda 12.8"),
    (["--cuda", "12.8"], "bisect needs --target NAME"),
    (["--package", "sglang", "--through-pins", "--cuda", "12.8", "--results", "r"], "--through-pins judges"),
])
def test_bad_through_pins_input_is_exit_2(args, message):
    result = CliRunner().invoke(cli, ["bisect", "flashinfer-jit", *args])
    assert result.exit_code == 2, result.output
    assert message in result.output


@pytest.mark.pypi
def test_through_pins_on_the_real_index(monkeypatch):
    monkeypatch.setenv("STACKFORGE_WHEEL_CACHE",
                       os.environ.get("STACKFORGE_WHEEL_CACHE") or str(REPO / ".cache" / "wheels"))
    result = CliRunner().invoke(cli, ["bisect", "flashinfer-jit", "--package", "sglang", "--through-pins",
                                      "--cuda", "12.8", "--target", TARGET, "--json"])
    assert result.exit_code == 0, result.output
    searches = {s["flavour"]: s for s in json.loads(result.stdout)["searches"]}
    assert (searches["devel"]["newest_admitting"], searches["devel"]["newest_admitting_exact"]) == ("0.5.9", True)
    change = next(c for c in searches["devel"]["changes"] if c["after"]["sglang"] == "0.5.10")
    assert change["before"]["sglang"] == "0.5.9"
    readings = change["after"]["judgement"]["readings"]
    assert [(r["package"], r["version"], r["status"]) for r in readings] == [
        ("flashinfer-python", "0.6.7.post2", "unavailable")]
    assert searches["wheels"]["newest_admitting"] is None


# --- the watch end to end, on a loopback index: pins read from METADATA, the pinned FlashInfer's wheel read ----

_JIT_RULES = ("flashinfer-jit-needs-nvcc", "flashinfer-sm120-needs-cuda129-nvcc",
              "flashinfer-sm120-needs-cuda129-torch-fallback")


def _gate_reader(root, ctx):
    text = (root / "flashinfer" / "gate.txt").read_text().strip()
    status = ReadingStatus.UNAVAILABLE if text == "refuse" else ReadingStatus.AVAILABLE
    return Reading("flashinfer-jit", status, f"stub gate: {text}", (CodeSite("flashinfer/gate.txt", 1, text),),
                   ("arch", "nvcc", "cuda"))


def _sglang_reader(root, ctx):
    return Reading("custom-allreduce", ReadingStatus.AVAILABLE, "stub")


def test_the_watch_judges_a_new_sglang_release_by_the_pins_in_its_metadata(tmp_path, monkeypatch):
    from stackforge.core.wheel_readings import ReaderSpec
    from tests._wheel_helpers import LoopbackIndex, make_wheel, serve

    sglang_spec = ReaderSpec("custom-allreduce", "sglang", _sglang_reader, "stub")
    gate_spec = ReaderSpec("flashinfer-jit", "flashinfer-python", _gate_reader, "stub")
    monkeypatch.setenv("STACKFORGE_WHEEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr("stackforge.watch.campaign.load_readers", lambda: (sglang_spec,))
    monkeypatch.setattr("stackforge.wheels.tier.load_readers", lambda: (sglang_spec, gate_spec))
    knowledge = load_knowledge()
    narrowed = type(knowledge)(rules=tuple(r for r in knowledge.rules if r.id in _JIT_RULES),
                               tables=knowledge.tables, targets=knowledge.targets)
    monkeypatch.setattr("stackforge.watch.campaign.load_knowledge", lambda user=None: narrowed)
    served = LoopbackIndex(core_metadata=True)
    # Two SGLang releases compat/sglang_pins.yaml does not hold: their pins come from their METADATA.
    for day, (version, flashinfer) in enumerate((("0.5.9.post1", "0.6.3"), ("0.5.9.post2", "0.6.7.post2")), 1):
        metadata = (f"Requires-Dist: torch==2.9.1\nRequires-Dist: flashinfer-python=={flashinfer}\n"
                    "Requires-Dist: sgl-kernel==0.3.21\nRequires-Python: >=3.10\n")
        served.add("sglang", make_wheel(tmp_path / "w", "sglang", version, {"sglang/__init__.py": ""},
                                        metadata=metadata), upload_time=f"2026-08-0{day}T00:00:00Z")
    for version, gate in (("0.6.3", "admit"), ("0.6.7.post2", "refuse")):
        served.add("flashinfer-python", make_wheel(tmp_path / "w", "flashinfer-python", version,
                                                   {"flashinfer/gate.txt": gate}))
    url, server = serve(served)
    try:
        result = CliRunner().invoke(cli, ["watch", "--package", "sglang", "--after", "0.5.9.post1",
                                          "--target", TARGET, "--results", str(tmp_path / "results"),
                                          "--index-url", url, "--json"])
    finally:
        server.shutdown()
    assert result.exit_code == 1, result.output
    (release,) = json.loads(result.stdout)["releases"]
    effects = release["pin_effects"]
    assert effects["moves"] == ["flashinfer 0.6.7.post2 (was 0.6.3)"]
    jit = {(c["cuda"], c["flavour"]): c for c in effects["changes"] if c["feature"] == "flashinfer-jit"}
    devel = jit[("12.8", "devel")]
    assert (devel["before"]["status"], devel["after"]["status"]) == ("admitted", "unavailable")
    assert devel["after"]["rules"] == ["flashinfer-sm120-needs-cuda129-nvcc"]
    assert devel["after"]["readings"][0]["version"] == "0.6.7.post2"
    assert jit[("12.8", "wheels")]["after"]["status"] == "unavailable"   # reported, not hidden by no nvcc
