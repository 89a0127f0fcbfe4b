"""torch symmetric memory: which cases torch has a kernel for, and which op SGLang runs.

The runtime probe ``torch-symm-mem`` is judged by the op SGLang's ``TorchSymmMemCommunicator``
runs for the GPU's capability and the world size (``multimem_all_reduce_`` or
``two_shot_all_reduce_``), read from the installed SGLang; the probe and the all-reduce sweep
report cases torch has no kernel for as unsupported instead of failing them. Both are checked here
without a GPU: the table against torch's kernel dispatch, SGLang's choice against the real 0.5.9
and 0.5.23 wheels, the verdict on recorded rank outcomes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PROBES = REPO / "stackforge" / "probes" / "scripts"
BENCH = REPO / "stackforge" / "bench" / "scripts"
sys.path[:0] = [str(PROBES), str(BENCH)]
import _sfprobe as sf  # noqa: E402  (in-image helper)
import allreduce_sweep  # noqa: E402
import symm_mem  # noqa: E402
from test_probe_scripts import fi063_python  # noqa: E402,F401  (SGLang 0.5.9 venv)
from test_sglang_custom_ar_dispatch import sglang0523_python  # noqa: E402,F401  (SGLang 0.5.23 venv)

U = "unsupported"


def support(op: str) -> dict[tuple[int, str], str]:
    return {(ws, dtype): U if sf.symm_mem_unsupported(op, ws, dtype, multicast=True) else "ok"
            for ws in (2, 4, 6, 8) for dtype in ("bfloat16", "float16", "float32")}


@pytest.mark.parametrize("op, ws6", [
    ("one_shot_all_reduce", "ok"), ("one_shot_all_reduce_out", "ok"), ("two_shot_all_reduce_", "ok"),
    ("multimem_all_reduce_", "ok"), ("two_shot_all_reduce_out", U),
])
def test_support_table_per_world_size_and_dtype(op, ws6):
    """AT_DISPATCH_FLOAT_AND_BFLOAT16 for every op (no float16); two_shot_all_reduce_out has no
    generic world-size kernel (2, 4, 8 only)."""
    table = support(op)
    for ws in (2, 4, 6, 8):
        assert table[(ws, "float16")] == U
        assert table[(ws, "bfloat16")] == table[(ws, "float32")] == (ws6 if ws == 6 else "ok"), (op, ws)


def test_multimem_without_multicast_is_unsupported_and_says_why():
    assert "needs multicast" in sf.symm_mem_unsupported("multimem_all_reduce_", 4, "bfloat16", multicast=False)
    assert sf.symm_mem_unsupported("two_shot_all_reduce_", 4, "bfloat16", multicast=False) is None
    assert "float16" in sf.symm_mem_unsupported("one_shot_all_reduce", 2, "float16")
    assert "world sizes 2, 4, 8 only (not 6)" in sf.symm_mem_unsupported("two_shot_all_reduce_out", 6, "float32")


def test_an_unsupported_case_says_which_torch_the_table_was_read_in():
    """The tables come from one pytorch commit; in an image whose torch is another, the reason says so."""
    other = sf.symm_mem_unsupported("two_shot_all_reduce_out", 6, "bfloat16", torch_git="f1e2d3c4b5a6" + "0" * 28)
    assert other.endswith("(not 6; read in pytorch 03a4032ba32d, not in this image's torch (git f1e2d3c4b5a6))")
    same = sf.symm_mem_unsupported("two_shot_all_reduce_out", 6, "bfloat16", torch_git=sf.SYMM_MEM_TABLE_COMMIT)
    assert same.endswith("(not 6)")
    assert "read in pytorch 03a4032ba32d" in sf.symm_mem_unsupported("one_shot_all_reduce", 2, "float16",
                                                                     torch_git="abc")


def test_sweep_reports_cases_without_a_kernel_as_unsupported():
    backend = object.__new__(allreduce_sweep.SymmMemBackend)
    backend.torch = type("T", (), {"ops": type("O", (), {"symm_mem": type("S", (), {
        "two_shot_all_reduce_out": object(), "one_shot_all_reduce_out": object()})})})
    backend.dist = type("D", (), {"get_world_size": staticmethod(lambda group=None: 6)})
    backend.config = {"symm_mem_op": "two_shot", "dtype": "bfloat16"}
    step = {"placement": "out-of-place", "mode": "eager", "size_bytes": 1 << 20, "count": 1 << 19}
    assert backend.unsupported(step) == ("unsupported: torch.ops.symm_mem.two_shot_all_reduce_out is built for "
                                         "world sizes 2, 4, 8 only (not 6)")
    backend.config = {"symm_mem_op": "one_shot", "dtype": "float16"}
    assert backend.unsupported(step).startswith("unsupported: torch.ops.symm_mem.one_shot_all_reduce_out has no "
                                                "float16 kernel")
    backend.config = {"symm_mem_op": "one_shot", "dtype": "bfloat16"}
    assert backend.unsupported(step) is None


@pytest.mark.parametrize("fixture, release, table", [
    ("fi063_python", "0.5.9", {"9": [4, 6, 8], "10": [6, 8]}),
    ("sglang0523_python", "0.5.23", {"9": [4, 6, 8], "10": [4, 6, 8]}),
])
def test_sglang_op_is_read_from_the_installed_release(request, fixture, release, table):
    python = request.getfixturevalue(fixture)
    code = (f"import sys, json; sys.path.insert(0, {str(PROBES)!r}); import symm_mem as s; "
            "t, where = s.sglang_multimem_table(); "
            "print(json.dumps({'table': {str(k): list(v) for k, v in t.items()}, 'where': where, "
            "'ops': {f'{c}x{w}': s.sglang_op(t, c, w) for c in (9, 10, 12) for w in (2, 4, 6, 8)}}))")
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["table"] == table and seen["where"].endswith("device_communicators/torch_symm_mem.py")
    ops = seen["ops"]
    assert [ops[f"9x{w}"] for w in (2, 4, 6, 8)] == ["two_shot_all_reduce_"] + ["multimem_all_reduce_"] * 3
    assert ops["10x4"] == ("two_shot_all_reduce_" if release == "0.5.9" else "multimem_all_reduce_")
    assert {ops[f"12x{w}"] for w in (2, 4, 6, 8)} == {"two_shot_all_reduce_"}  # sm_120: no multimem in SGLang


def test_without_sglang_the_table_is_stackforges_copy(tmp_path):
    done = subprocess.run([sys.executable, "-S", "-c", f"import sys; sys.path.insert(0, {str(PROBES)!r}); "
                           "import symm_mem as s; print(s.sglang_multimem_table())"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "{9: (4, 6, 8), 10: (4, 6, 8)}" in done.stdout and "no readable SGLang" in done.stdout


def outcome(states: dict[str, str], *, multicast: bool = True, chosen: str = "multimem_all_reduce_"):
    events = [sf.RankEvent(r, "rendezvous", "ok", data={"multicast": multicast, "capability": 9, "sglang_op": chosen})
              for r in (0, 1)]
    for phase, state in states.items():
        for rank in (0, 1):
            if state == "ok":
                events.append(sf.RankEvent(rank, phase, "ok", data={"us": 10.0 + rank}))
            elif state == "fail":
                events.append(sf.RankEvent(rank, phase, "check-fail", "AssertionError: off by up to 3.0"))
            else:
                events.append(sf.RankEvent(rank, phase, "skip", state))
    return sf.RanksOutcome(tuple(events), (0, 0), None, ())


def judge(states: dict[str, str], **kwargs):
    ranks = outcome(states, **kwargs)
    return symm_mem.decide("torch symmetric memory on 4 GPUs", symm_mem.summarize(ranks), ranks, True)


def test_a_broken_multimem_fails_even_when_the_other_ops_work():
    verdict = judge({"one_shot_all_reduce": "ok", "two_shot_all_reduce_": "ok", "multimem_all_reduce_": "fail"})
    assert verdict.status == "fail"
    assert verdict.reason.startswith("torch symmetric memory on 4 GPUs, capability 9: SGLang runs "
                                     "multimem_all_reduce_ here; rank 0 multimem_all_reduce_: AssertionError")


def test_the_captured_replay_decides_too():
    verdict = judge({"one_shot_all_reduce": "ok", "two_shot_all_reduce_": "ok", "multimem_all_reduce_": "ok",
                     "graph_replay": "fail"})
    assert verdict.status == "fail" and "rank 0 graph_replay: AssertionError" in verdict.reason
    passed = judge({"one_shot_all_reduce": "ok", "two_shot_all_reduce_": "ok", "multimem_all_reduce_": "ok",
                    "graph_replay": "ok"})
    assert passed.status == "pass"
    assert "exact eagerly (11.0 us) and replayed from a CUDA graph (11.0 us)" in passed.reason


def test_other_ops_failing_are_metrics_when_sglang_uses_two_shot():
    ranks = outcome({"one_shot_all_reduce": "fail", "two_shot_all_reduce_": "ok",
                     "multimem_all_reduce_": "unsupported: needs multicast", "graph_replay": "ok"},
                    chosen="two_shot_all_reduce_")
    metrics = symm_mem.summarize(ranks)
    verdict = symm_mem.decide("w", metrics, ranks, False)
    assert verdict.status == "pass", verdict.reason
    assert metrics["one_shot_all_reduce"] == "fail" and metrics["multimem_all_reduce_"] == "unsupported"


def test_no_multicast_fails_with_sglangs_reason():
    verdict = judge({"one_shot_all_reduce": "ok", "two_shot_all_reduce_": "ok",
                     "multimem_all_reduce_": "unsupported: needs multicast"}, multicast=False)
    assert verdict.status == "fail" and "disables itself without it" in verdict.reason
