"""Which SGLang custom all-reduce class the runtime probe and the bench construct.

SGLang's ``GroupCoordinator`` asks ``dispatch_custom_allreduce`` for the class: without arguments in
0.5.9, with ``group=, device=`` in 0.5.23 (where full-NVLink CUDA groups get the JIT-compiled
``CustomAllReduceV2``); older releases name ``CustomAllreduce`` directly.
``_sfprobe.sglang_custom_allreduce_class`` follows whichever the installed release has. The
selection logic is tested here against stand-in modules (the 0.5.23 dispatcher cannot run without a
GPU), and against the real SGLang 0.5.9 dispatcher in its venv.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "stackforge" / "probes" / "scripts"
sys.path.insert(0, str(SCRIPTS))
import _sfprobe as sf  # noqa: E402  (in-image helper, not a package module)
from test_probe_scripts import fi063_python, torch_python  # noqa: E402,F401  (venv fixtures)


class CustomAllreduce:
    pass


class CustomAllReduceV2:
    pass


def stand_in(monkeypatch: pytest.MonkeyPatch, **attributes: object) -> None:
    module = types.ModuleType(sf.SGLANG_CUSTOM_AR_MODULE)
    for name, value in attributes.items():
        setattr(module, name, value)
    monkeypatch.setitem(sys.modules, sf.SGLANG_CUSTOM_AR_MODULE, module)


def test_release_without_a_dispatcher_gets_the_legacy_class(monkeypatch):
    stand_in(monkeypatch, CustomAllreduce=CustomAllreduce)
    assert sf.sglang_custom_allreduce_class("group", "cuda:0") == (CustomAllreduce, "CustomAllreduce")


def test_dispatcher_without_arguments_is_called_bare(monkeypatch):
    stand_in(monkeypatch, CustomAllreduce=CustomAllreduce, dispatch_custom_allreduce=lambda: CustomAllreduce)
    assert sf.sglang_custom_allreduce_class("group", "cuda:0") == (CustomAllreduce, "CustomAllreduce")


def test_dispatcher_with_group_and_device_sees_them(monkeypatch):
    seen = {}

    def dispatch_custom_allreduce(group, device):
        seen.update(group=group, device=device)
        return CustomAllReduceV2 if group == "nvlink-clique" else CustomAllreduce

    stand_in(monkeypatch, CustomAllreduce=CustomAllreduce, dispatch_custom_allreduce=dispatch_custom_allreduce)
    assert sf.sglang_custom_allreduce_class("nvlink-clique", "cuda:3") == (CustomAllReduceV2, "CustomAllReduceV2")
    assert seen == {"group": "nvlink-clique", "device": "cuda:3"}
    assert sf.sglang_custom_allreduce_class("pcie", "cuda:0")[1] == "CustomAllreduce"


def test_partial_is_named_after_its_class(monkeypatch):
    chosen = functools.partial(CustomAllReduceV2, enable_register_for_capturing=True)
    stand_in(monkeypatch, dispatch_custom_allreduce=lambda group, device: chosen)
    assert sf.sglang_custom_allreduce_class(None, None) == (chosen, "CustomAllReduceV2(partial)")


def test_real_sglang_059_dispatcher_picks_custom_allreduce_on_cuda(fi063_python):
    """SGLang 0.5.9's own dispatcher, asked as on a CUDA build (the venv's torch is the CPU wheel, so
    SGLang's ``_is_cuda`` is set by hand; everything else is SGLang's code)."""
    code = textwrap.dedent(f"""
        import importlib, sys
        sys.path.insert(0, {str(SCRIPTS)!r})
        import _sfprobe as sf
        module = importlib.import_module(sf.SGLANG_CUSTOM_AR_MODULE)
        module._is_cuda = True
        chosen, name = sf.sglang_custom_allreduce_class(None, None)
        print(name, chosen.__module__)
    """)
    done = subprocess.run([str(fi063_python), "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["CustomAllreduce", sf.SGLANG_CUSTOM_AR_MODULE]


# --------------------------------------------------------------------------------------------
# SGLang's own P2P check, which a probe must skip the way a server does
# --------------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def sglang0523_python() -> Path:
    """SGLang 0.5.23 with what importing its custom all-reduce modules needs (CPU torch)."""
    import _probe_venvs as venvs
    return venvs.build_venv("sgl-0.5.23-custom-ar", [
        *venvs.torch_steps(), ["--no-deps", "sglang==0.5.23"], list(venvs.SGLANG_0523_IMPORT_DEPS)])


# Two CPU ranks on gloo drive SGLang's constructor in a server's call order. What needs a GPU is
# stood in for: a CUDA build (``_is_cuda``), the kernel library being present
# (``ops.IS_CUSTOM_AR_AVAILABLE``) and NVML's full-NVLink answer. Everything else, the P2P check
# included, is SGLang's code; the constructor then stops at the first call into the CUDA kernel
# library (``ops.meta_size``), which is where a CPU machine has to stop.
TWO_RANKS = textwrap.dedent("""
    import importlib, os, sys, traceback
    sys.path.insert(0, {scripts!r})
    import torch, torch.distributed as dist, torch.multiprocessing as mp
    import _sfprobe as sf

    def rank_main(rank, port, skip, out_dir):
        said = open(os.path.join(out_dir, f"rank{{rank}}.txt"), "w")  # one file a rank: no interleaving
        os.environ["CUDA_VISIBLE_DEVICES"] = "0,1"
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{{port}}", rank=rank, world_size=2)
        group = dist.new_group(backend="gloo")
        utils = importlib.import_module(sf.SGLANG_CUSTOM_AR_UTILS_MODULE)
        if skip:
            print("p2p_check", sf.skip_sglang_p2p_check().split(",")[0], file=said)
        custom_ar = importlib.import_module(sf.SGLANG_CUSTOM_AR_MODULE)
        for module in (utils, custom_ar):
            module._is_cuda = True
            if hasattr(module, "is_full_nvlink"):
                module.is_full_nvlink = lambda ids, world_size: True
        custom_ar.ops.IS_CUSTOM_AR_AVAILABLE = True
        try:
            chosen, _ = sf.sglang_custom_allreduce_class(group, torch.device("cuda", rank))
            chosen(group=group, device=torch.device("cuda", rank))
            print("constructed", file=said)
        except BaseException as exc:
            frames = [frame.name for frame in traceback.extract_tb(exc.__traceback__)]
            print("stopped", type(exc).__name__, "in", frames[-1], "|", str(exc).splitlines()[0], file=said)
        said.close()
        os._exit(0)

    if __name__ == "__main__":
        mp.spawn(rank_main, args=(int(sys.argv[1]), sys.argv[2] == "skip", sys.argv[3]), nprocs=2)
""").format(scripts=str(SCRIPTS))


def two_ranks(python: Path, skip: str, tmp_path: Path) -> list[list[str]]:
    """What each rank said, one list of lines a rank."""
    out_dir = tmp_path / skip
    out_dir.mkdir()
    script = tmp_path / "two_ranks.py"
    script.write_text(TWO_RANKS)
    # The legacy class: 0.5.23's CustomAllReduceV2 gate runs the same P2P check after reading the
    # device capability, which a CPU torch cannot answer.
    env = {**os.environ, "SGLANG_OPT_USE_CUSTOM_ALL_REDUCE_V2": "0", "HOME": str(tmp_path)}
    done = subprocess.run([str(python), str(script), str(sf.free_tcp_port()), skip, str(out_dir)],
                          capture_output=True,
                          text=True, timeout=600, check=False, env=env)
    assert done.returncode == 0, done.stdout[-1000:] + done.stderr[-3000:]
    return [(out_dir / f"rank{rank}.txt").read_text().splitlines() for rank in (0, 1)]


@pytest.mark.parametrize("release, crash", [
    ("0.5.9", "stopped AssertionError in get_world_group | world group is not initialized"),
    ("0.5.23", "stopped RuntimeError in _read | parallel name 'world_group' has not been written"),
])
def test_sglang_p2p_check_crashes_without_its_world_group_and_the_skip_gets_past_it(
        release, crash, request, tmp_path):
    python = request.getfixturevalue("fi063_python" if release == "0.5.9" else "sglang0523_python")
    for said in two_ranks(python, "check", tmp_path):
        assert len(said) == 1 and said[0].startswith(crash), said
    past_the_check = ("stopped AttributeError in __init__ | module "
                      "'sglang.srt.distributed.device_communicators.custom_all_reduce_ops' has no attribute 'meta_size'")
    for said in two_ranks(python, "skip", tmp_path):
        assert said == ["p2p_check skipped", past_the_check], said


# --------------------------------------------------------------------------------------------
# A mismatch on one rank is reported by every rank, without desynchronising them
# --------------------------------------------------------------------------------------------

AGREE = textwrap.dedent("""
    import datetime, sys
    sys.path.insert(0, {scripts!r})
    import _sfprobe as sf
    import custom_allreduce as car

    def worker(rank, world_size, options, reporter):
        import torch, torch.distributed as dist
        with reporter.phase("init"):
            dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{{options['port']}}", rank=rank,
                                    world_size=world_size, timeout=datetime.timedelta(seconds=30))
            group = dist.new_group(backend="gloo")
        with reporter.attempt("allreduce_2048"):      # rank 1's kernel is off by 0.5; the others are exact
            car.agree_on_differences(dist, group, 0.5 if rank == 1 else 0.0, 1.0, "eager")
        with reporter.attempt("graph_capture"):       # rank 2's capture raises; the others capture fine
            def capture():
                if rank == 2:
                    raise RuntimeError("CUDA error: operation not permitted when stream is capturing")
                return "graph"
            car.agree_on_step(dist, group, capture, "graph capture")
        with reporter.phase("next_collective") as data:  # every rank must still be in step here
            total = torch.ones(1)
            dist.all_reduce(total)
            data["sum"] = float(total.item())
        dist.destroy_process_group()

    if __name__ == "__main__":
        outcome = sf.run_ranks(worker, 3, {{"port": sf.free_tcp_port()}}, phase_timeout_s=20)
        for event in outcome.events:
            if event.phase in ("allreduce_2048", "graph_capture", "next_collective") and event.state != "start":
                print(event.rank, event.phase, event.state, event.detail or event.data.get("sum"))
        print("hung", outcome.hung)
""")


def test_one_ranks_mismatch_or_error_is_reported_by_all_ranks_and_they_stay_in_step(torch_python, tmp_path):
    script = tmp_path / "agree.py"
    script.write_text(AGREE.format(scripts=str(SCRIPTS)))
    done = subprocess.run([str(torch_python), str(script)], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert "hung None" in lines
    mismatch = "AssertionError: eager: custom all-reduce differs from NCCL on rank(s) 1 (by 0.5, max |NCCL| 1)"
    assert sorted(line for line in lines if "allreduce_2048" in line) == [
        f"{rank} allreduce_2048 check-fail {mismatch}" for rank in range(3)]
    raised = ("RuntimeError: graph capture: custom all-reduce raised on rank(s) 2: rank 2: RuntimeError: CUDA error: "
              "operation not permitted when stream is capturing")
    capture_lines = sorted(line for line in lines if "graph_capture" in line)
    assert len(capture_lines) == 3, lines
    for rank, line in enumerate(capture_lines):
        assert line.startswith(f"{rank} graph_capture check-fail {raised}"), line
    assert sorted(line for line in lines if "next_collective" in line) == [
        f"{rank} next_collective ok 3.0" for rank in range(3)]


def test_mismatched_ranks_are_those_beyond_bf16_rounding():
    sys.path.insert(0, str(SCRIPTS))
    try:
        import custom_allreduce as car
    finally:
        sys.path.pop(0)
    assert car.mismatched_ranks([(0.01, 1.0), (0.06, 1.0), (0.2, 10.0), (3.0, 10.0)]) == [1, 3]


PROBE_BUG = textwrap.dedent("""
    import sys, tempfile, torch.distributed as dist
    sys.path.insert(0, {scripts!r})
    import _sfprobe as sf
    import custom_allreduce as car

    dist.init_process_group("gloo", init_method="file://" + tempfile.mktemp(), rank=0, world_size=1)

    def raises(kind):
        def step():
            raise kind("boom")
        return step

    try:
        for kind in (AttributeError, RuntimeError):
            try:
                car.agree_on_step(dist, None, raises(kind), "graph capture")
            except Exception as exc:
                print(sf.failure_status(sf.describe_exception(exc)), type(exc).__name__)
    finally:
        # A gloo group left for interpreter finalization can abort the process (SIGABRT,
        # "terminate called without an active exception"; pytorch/pytorch#179291), as the
        # probe scripts' own workers avoid by destroying theirs.
        dist.destroy_process_group()
""")


def test_a_probe_bug_on_one_rank_stays_an_error_not_a_measured_fail(torch_python, tmp_path):
    """agree_on_step raises the first failing rank's type where it names a probe bug (graded error)."""
    script = tmp_path / "bug.py"
    script.write_text(PROBE_BUG.format(scripts=str(SCRIPTS)))
    done = subprocess.run([str(torch_python), str(script)], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == ["error AttributeError", "fail RuntimeError"]
