"""The FlashInfer gate probe's build step (``flashinfer_gates.py --build``) and its decisions.

The decisions are pure functions of the gates, the toolkit and the builds, tested with values of the
script's own dataclasses. :func:`build_module` is tested with real ninja files run by the real ``ninja``
and ``cc`` (a compile past its limit, a link that cannot find a library, a link that succeeds and a
warm rerun ninja finds up to date), standing in for FlashInfer's generated one; the runs against real
FlashInfer releases and nvcc are in tests/test_probe_scripts.py (heavy).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from stackforge.core.model import Interconnect, Target
from stackforge.core.records import Status
from stackforge.jobs.job_runner import (
    JIT_CACHE_CONTAINER_DIR,
    ImageRef,
    Job,
    jit_cache_dir,
    jit_cache_mount,
    outcome_from_payload,
)
from stackforge.probes.catalog import catalog
from stackforge.probes.execute import probe_kind

SCRIPTS = Path(__file__).resolve().parents[1] / "stackforge" / "probes" / "scripts"
sys.path.insert(0, str(SCRIPTS))
try:
    import _sfprobe as sf
    import flashinfer_gates as fg
finally:
    sys.path.remove(str(SCRIPTS))

SM120 = sf.parse_arch("12.0")
FLAGS = "-gencode=arch=compute_120f,code=sm_120f"
RES = fg.ArchResolution("device auto-detection", "12.0f", ((12, "0f"),), "", "FlashInfer's device auto-detection")
NVCC = fg.Toolkit("/usr/local/cuda", "13.0", "", "/usr/local/cuda/bin/nvcc", "/usr/bin/ninja")
NO_NVCC = fg.Toolkit("/nonexistent", "12.9", "", "", "/usr/bin/ninja")
LINKER_WORDS = "/usr/bin/ld: cannot find -lcudart: No such file or directory"


def gates(status: str = "admitted", aot: bool | None = False) -> dict[str, fg.ModuleGate]:
    names = {"norm": "jit", "sampling": "jit", "page": "jit", "attention-decode": "jit",
             "allreduce-fusion": "ar-fusion"}
    return {name: fg.ModuleGate(name, role, status, f"gen_{name}", FLAGS if status == "admitted" else "x",
                                (FLAGS,), "global", aot) for name, role in names.items()}


def built(name: str, seconds: float = 30.0, built_by: str = "") -> fg.ModuleBuild:
    return fg.ModuleBuild(name, "built", "link", seconds, "[1/1] c++ a.o -shared -lcudart -o x.so",
                          f"/ws/{name}/{name}.so", 1000, f"c++ a.o -shared -lcudart -o /ws/{name}/{name}.so", built_by)


def jit(builds: fg.Builds | None, toolkit: fg.Toolkit = NVCC, gate_map=None, chosen=("norm", "sampling",
                                                                                    "attention-decode")):
    return fg.decide_jit("0.7.2", SM120, RES, gate_map or gates(), toolkit, builds, chosen)


# --------------------------------------------------------------------------------------------- decisions

def test_every_chosen_module_built_is_a_pass_at_the_built_level():
    result = jit(fg.Builds((built("norm", 30.2), built("sampling", 40.0), built("attention-decode", 200.0))))
    assert result.status == "pass"
    assert result.metrics == {"evidence_level": "built"}
    assert result.reason == (f"FlashInfer 0.7.2 built (compiled and linked) its norm, sampling, attention-decode "
                             f"modules for {FLAGS} with nvcc 13.0 in 270.2 s; nothing was loaded or run (no GPU)")
    assert "link: c++ a.o -shared -lcudart -o /ws/norm/norm.so" in result.evidence


def test_a_link_failure_is_a_fail_in_the_linkers_words():
    broken = fg.ModuleBuild("sampling", "link-failed", "link", 41.0, f"[1/1] c++ ...\nFAILED: x.so\n{LINKER_WORDS}\n"
                            "collect2: error: ld returned 1 exit status\nninja: build stopped: subcommand failed.")
    result = jit(fg.Builds((built("norm"), broken)))
    assert result.status == "fail"
    assert result.reason == f"FlashInfer 0.7.2's sampling module does not link for sm_120 (link): {LINKER_WORDS}"
    assert "evidence_level" not in result.metrics
    assert LINKER_WORDS in result.evidence


def test_a_compile_failure_is_a_fail_in_the_compilers_words():
    words = "norm.cuh:20:10: fatal error: curand.h: No such file or directory"
    result = jit(fg.Builds((fg.ModuleBuild("norm", "compile-failed", "compile", 15.0, f"FAILED: n.o\n{words}\n"),)))
    assert result.status == "fail"
    assert result.reason == f"FlashInfer 0.7.2's norm module does not compile for sm_120 (compile): {words}"


def test_a_build_past_its_limit_is_a_timeout_never_a_fail():
    result = jit(fg.Builds((built("norm"), fg.ModuleBuild("attention-decode", "timeout", "compile", 900.0, "[1/2]"))))
    assert result.status == "timeout"
    assert "attention-decode module" in result.reason and "did not finish within its time limit" in result.reason
    sf.result_line(result.status, result.reason)   # a status the result line may carry


def test_a_probe_script_may_report_its_own_timeout_but_no_crash():
    kind = probe_kind()
    assert outcome_from_payload(kind, {"status": "timeout", "reason": "build"}).status is Status.TIMEOUT
    assert outcome_from_payload(kind, {"status": "crash", "reason": "x"}).status is Status.ERROR


def test_modules_ninja_found_up_to_date_say_whose_cache_they_came_from():
    stamp = "run r1, 2026-12-01T10:00:00Z"
    warm = jit(fg.Builds((built("norm", 0.1, stamp), built("sampling", 0.1, stamp))))
    assert warm.status == "pass" and warm.metrics == {"evidence_level": "built"}
    assert f"in 0.2 s (from the build cache of {stamp}); nothing was loaded or run" in warm.reason
    mixed = jit(fg.Builds((built("norm", 0.1, stamp), built("sampling", 40.0))))
    assert f"(norm from the build cache of {stamp})" in mixed.reason


def test_prebuilt_modules_without_nvcc_are_admitted_not_built():
    result = jit(None, NO_NVCC, gates(aot=True))
    assert result.status == "pass"
    assert result.metrics == {"evidence_level": "admitted"}
    assert "nothing built or run here" in result.reason


def test_prebuilt_modules_with_nvcc_build_nothing_and_are_admitted():
    result = jit(fg.Builds((), (("norm", "prebuilt (AOT / jit-cache)"),)))
    assert (result.status, result.metrics) == ("pass", {"evidence_level": "admitted"})
    assert "nothing to build here (norm not built: prebuilt" in result.reason


def test_no_nvcc_and_nothing_prebuilt_is_a_fail_that_says_the_image_cannot_jit():
    result = jit(None, NO_NVCC)
    assert result.status == "fail"
    assert result.reason.startswith("no nvcc in this flavour: ")
    assert "this image cannot JIT-compile them" in result.reason
    assert result.metrics == {"jit_possible": False}
    fusion = fg.decide_ar_fusion("0.7.2", SM120, RES, gates(), NO_NVCC, None)
    assert (fusion.status, fusion.metrics) == ("fail", {"jit_possible": False})


def test_a_chosen_module_the_gate_refuses_fails_before_any_build():
    gate_map = {**gates(), "sampling": fg.ModuleGate("sampling", "jit", "rejected", "gen_sampling_module",
                                                     "RuntimeError: No supported CUDA architectures found")}
    result = jit(None, gate_map=gate_map)
    assert result.status == "fail"
    assert "sampling module no code for sm_120: RuntimeError: No supported CUDA" in result.reason


def test_ar_fusion_built_and_link_failed():
    done = fg.decide_ar_fusion("0.7.2", SM120, RES, gates(), NVCC, fg.Builds((built("allreduce-fusion", 300.0),)))
    assert (done.status, done.metrics) == ("pass", {"evidence_level": "built"})
    assert "built (compiled and linked) its allreduce-fusion module" in done.reason
    broken = fg.ModuleBuild("allreduce-fusion", "link-failed", "link", 300.0, LINKER_WORDS)
    failed = fg.decide_ar_fusion("0.7.2", SM120, RES, gates(), NVCC, fg.Builds((broken,)))
    assert failed.status == "fail" and failed.reason.endswith(LINKER_WORDS)
    gate_only = fg.decide_ar_fusion("0.7.2", SM120, RES, gates(), NVCC, None)
    assert (gate_only.status, gate_only.metrics) == ("pass", {"evidence_level": "admitted"})


def build_args(arch: str = "12.0") -> object:
    from types import SimpleNamespace
    return SimpleNamespace(build=True, build_timeout=600.0, cache_label="", arch=sf.parse_arch(arch), gpus=8,
                           interconnect="pcie")


def test_a_module_the_stacks_sglang_refuses_on_the_target_is_not_built_and_stays_admitted(monkeypatch):
    """SGLang 0.5.14+ rejects allreduce fusion on sm_12x in its own code: no serving run builds trtllm_comm
    there, so the gate does not spend minutes building it; FlashInfer's admission is what it reports."""
    refusal = "SGLang 0.5.23 rejects the feature on this target, so no serving run builds the module here (live: x)"
    monkeypatch.setattr(fg, "serving_refusal", lambda name, args: refusal if name == "allreduce-fusion" else "")

    def no_build(*args, **kwargs):
        raise AssertionError("a module SGLang refuses was built")
    monkeypatch.setattr(fg, "build_module", no_build)
    builds = fg.maybe_build(build_args(), ("allreduce-fusion",), gates(), {"allreduce-fusion": object()}, NVCC)
    assert builds == fg.Builds((), (("allreduce-fusion", refusal),))
    done = fg.decide_ar_fusion("0.7.2", SM120, RES, gates(), NVCC, builds)
    assert (done.status, done.metrics) == ("pass", {"evidence_level": "admitted"})
    assert f"nothing to build here (allreduce-fusion not built: {refusal})" in done.reason
    assert f"allreduce-fusion: not built: {refusal}" in done.evidence


FUSION_FILE_0_5_23 = """
def _resolve_backend(backend, is_multi_node):
    if not (is_sm90_supported() or is_sm100_supported()):
        raise ValueError("FlashInfer allreduce fusion requires SM90 or SM10X NVIDIA GPUs.")
    return backend
"""


def test_serving_refusal_reads_sglangs_own_gate_and_never_blocks_a_build_it_cannot_decide(monkeypatch, tmp_path):
    """SGLang's ``_resolve_backend`` (0.5.14+), read in the installed SGLang and decided for the target: a
    check that raises for sm_12x names itself; one that admits, an SGLang without it (< 0.5.14) or none at
    all leaves the module to be built."""
    import _sglang_source
    root = tmp_path / "site"
    fusion = root / "sglang" / "srt" / "layers" / "flashinfer_comm_fusion.py"
    fusion.parent.mkdir(parents=True)
    fusion.write_text(FUSION_FILE_0_5_23)
    real_gate = _sglang_source.fusion_gate
    monkeypatch.setattr(_sglang_source, "fusion_gate", lambda root_=None: real_gate(str(root)))
    versions = {"sglang": "0.5.23"}
    monkeypatch.setattr(sf, "installed_version", versions.get)
    refusal = fg.serving_refusal("allreduce-fusion", build_args("12.0"))
    assert refusal.startswith("SGLang 0.5.23 rejects the feature for capability 12.0 in its own code, so no "
                              "serving run builds the module here (flashinfer_comm_fusion.py:3 _resolve_backend: "
                              "`if not (is_sm90_supported() or is_sm100_supported()): raise "), refusal
    assert "requires SM90 or SM10X" in refusal and refusal.endswith("; read, not run)")
    assert fg.serving_refusal("allreduce-fusion", build_args("9.0")) == ""
    assert fg.serving_refusal("allreduce-fusion", build_args("10.0")) == ""
    assert fg.serving_refusal("norm", build_args("12.0")) == ""     # no single serving feature decides norm
    fusion.unlink()                                                  # SGLang < 0.5.14: no gate of its own
    assert fg.serving_refusal("allreduce-fusion", build_args("12.0")) == ""
    fusion.write_text(FUSION_FILE_0_5_23)
    def unreadable(target):
        raise SyntaxError("flashinfer_comm_fusion.py: invalid syntax")
    monkeypatch.setitem(fg.SERVING_GATES, "allreduce-fusion", unreadable)
    assert fg.serving_refusal("allreduce-fusion", build_args("12.0")) == ""   # cannot be read: build
    versions.clear()                                                 # no SGLang: FlashInfer alone decides
    assert fg.serving_refusal("allreduce-fusion", build_args("12.0")) == ""


def test_first_error_line_prefers_the_missing_tool_to_ninjas_summary():
    output = "[1/2] nvcc ...\nsh: 1: cicc: not found\nninja: build stopped: subcommand failed."
    assert fg.first_error_line(output) == "sh: 1: cicc: not found"


def test_flashinfer_probes_build_and_keep_a_jit_cache():
    for spec in (s for s in catalog() if s.id.startswith("gate.flashinfer.")):
        assert "--build" in spec.args and spec.jit_cache
        budget = float(spec.args[spec.args.index("--build-timeout") + 1])
        assert spec.default_timeout_s > budget   # the script's own timeout comes first, with its evidence


# --------------------------------------------------------------------------------------------- build_module

class NinjaSpec:
    """What build_module reads of a FlashInfer JitSpec, around a ninja file of our own."""

    def __init__(self, root: Path, compile_command: str, link_flags: str = "") -> None:
        self.build_dir = root / "mod"
        self.ninja_path = self.build_dir / "build.ninja"
        self.text = (f"rule compile\n  command = {compile_command}\nrule link\n  command = cc -shared $in "
                     f"{link_flags} -o $out\nbuild {self.build_dir}/a.o: compile {root}/a.c\n"
                     f"build {self.build_dir}/mod.so: link {self.build_dir}/a.o\ndefault {self.build_dir}/mod.so\n")
        (root / "a.c").write_text("int sf_probe_answer(void) { return 42; }\n")

    def write_ninja(self) -> None:
        self.build_dir.mkdir(parents=True, exist_ok=True)
        self.ninja_path.write_text(self.text)


@pytest.fixture()
def toolchain() -> fg.Toolkit:
    if not (shutil.which("ninja") and shutil.which("cc")):
        pytest.skip("needs ninja and cc on PATH")
    return fg.Toolkit("/usr", "", "", "/usr/bin/true", shutil.which("ninja"))


CC = "cc -fPIC -c $in -o $out"


def test_build_module_links_then_finds_it_up_to_date(tmp_path, toolchain):
    spec = NinjaSpec(tmp_path, CC)
    cold = fg.build_module("mod", spec, toolchain, 60, "r1")
    assert cold.status == "built", cold.output
    assert (cold.library, cold.built_by) == (str(spec.build_dir / "mod.so"), "")
    assert "-shared" in cold.link_command and cold.library_bytes > 0
    warm = fg.build_module("mod", spec, toolchain, 60, "r2")
    assert warm.status == "built" and warm.built_by.startswith("run r1, ")   # who built it, not this run
    assert fg.NINJA_NOOP in warm.output


def test_build_module_link_failure_and_missing_library(tmp_path, toolchain):
    failed = fg.build_module("mod", NinjaSpec(tmp_path, CC, "-lsf_no_such_library"), toolchain, 60, "")
    assert (failed.status, failed.stage) == ("link-failed", "link")
    assert "cannot find -lsf_no_such_library" in fg.first_error_line(failed.output)


def test_modules_build_side_by_side_and_the_first_in_order_that_fails_decides(tmp_path, toolchain):
    """Each chosen module gets its own ninja at once: two 2-second compiles take about 2 s together,
    not 4; a link failure of the second module decides though the first built."""
    for name in "abc":
        (tmp_path / name).mkdir()
    slow_cc = f"sleep 2 && {CC}"
    specs = {"norm": NinjaSpec(tmp_path / "a", slow_cc), "sampling": NinjaSpec(tmp_path / "b", slow_cc)}
    builds = fg.maybe_build(build_args(), ("norm", "sampling"), gates(), specs, toolchain)
    assert [b.status for b in builds.modules] == ["built", "built"], [b.output for b in builds.modules]
    assert builds.wall_s is not None and builds.wall_s < 3.5 < sum(b.seconds for b in builds.modules)
    result = jit(builds, toolchain, chosen=("norm", "sampling"))
    assert f"in {builds.wall_s} s" in result.reason and result.metrics == {"evidence_level": "built"}
    specs["sampling"] = NinjaSpec(tmp_path / "c", CC, "-lsf_no_such_library")
    broken = jit(fg.maybe_build(build_args(), ("norm", "sampling"), gates(), specs, toolchain), toolchain,
                 chosen=("norm", "sampling"))
    assert broken.status == "fail" and "sampling module does not link" in broken.reason, broken.reason


def test_build_module_past_its_limit_is_a_timeout(tmp_path, toolchain):
    slow = fg.build_module("mod", NinjaSpec(tmp_path, "sleep 30"), toolchain, 1.0, "")
    assert (slow.status, slow.stage) == ("timeout", "compile")
    assert slow.seconds < 10
    spent = fg.build_module("mod", NinjaSpec(tmp_path, CC), toolchain, 0.0, "")
    assert spent.status == "timeout"


# --------------------------------------------------------------------------------------------- the runner's cache

def test_jit_cache_is_one_folder_per_image_and_target_arch(tmp_path):
    spec = next(s for s in catalog() if s.id == "gate.flashinfer.jit")
    target = Target("rtx-pro-6000-x8-pcie", "RTX PRO 6000", "12.0", 8, Interconnect.PCIE)
    image = ImageRef("sf/x:1", "sha256:abc")
    job = Job(stack=None, target=target, spec=spec, args=spec.args, timeout_s=1.0)  # type: ignore[arg-type]
    mounts, args = jit_cache_mount(job, image, "run-7", shares_host_files=True, root=tmp_path)
    folder = jit_cache_dir(image, target, tmp_path)
    assert folder == tmp_path / "sha256-abc" / "arch-12.0" and folder.is_dir()
    # another target of the same arch builds the same modules: it shares the folder; another arch does not
    fewer = Target("rtx-pro-6000-x2-pcie", "RTX PRO 6000", "12.0", 2, Interconnect.PCIE)
    hopper = Target("h200-x8-nvswitch", "H200", "9.0", 8, Interconnect.NVSWITCH)
    assert jit_cache_dir(image, fewer, tmp_path) == folder
    assert jit_cache_dir(image, hopper, tmp_path) == tmp_path / "sha256-abc" / "arch-9.0"
    assert [(m.source, m.target, m.read_only) for m in mounts] == [(folder, JIT_CACHE_CONTAINER_DIR, False)]
    assert args == ["--workspace", JIT_CACHE_CONTAINER_DIR, "--cache-label", "run-7"]
    assert jit_cache_mount(job, image, "r", shares_host_files=False, root=tmp_path) == ([], [])
    other = next(s for s in catalog() if s.id == "gate.torch.arch-list")
    plain = Job(stack=None, target=target, spec=other, args=(), timeout_s=1.0)  # type: ignore[arg-type]
    assert jit_cache_mount(plain, image, "r", shares_host_files=True, root=tmp_path) == ([], [])


def test_jobs_sharing_a_jit_cache_take_turns_and_a_cancel_stops_the_wait(tmp_path):
    """Two ninja runs in one build directory would race: a second job of the same (image, arch) waits for
    the first's container to end; one cancelled while it waits never starts."""
    import threading

    from stackforge.jobs.job_runner import jit_cache_turn, jit_cache_turn_file
    spec = next(s for s in catalog() if s.id == "gate.flashinfer.jit")
    target = Target("rtx-pro-6000-x8-pcie", "RTX PRO 6000", "12.0", 8, Interconnect.PCIE)
    job = Job(stack=None, target=target, spec=spec, args=spec.args, timeout_s=1.0)  # type: ignore[arg-type]
    mounts, _ = jit_cache_mount(job, ImageRef("sf/x:1", "sha256:abc"), "run-7", shares_host_files=True,
                                root=tmp_path)
    folder = mounts[0].source
    order: list[str] = []
    with jit_cache_turn(folder, job, "run-7", None) as first:
        assert first
        assert "run run-7: gate.flashinfer.jit for rtx-pro-6000-x8-pcie" in \
            jit_cache_turn_file(folder, spec).read_text()
        sglang = next(s for s in catalog() if s.id == "gate.sglang.jit")   # another builder's tree: no wait
        sglang_job = Job(stack=None, target=target, spec=sglang, args=(), timeout_s=1.0)  # type: ignore[arg-type]
        with jit_cache_turn(folder, sglang_job, "run-7", None) as beside:
            assert beside

        def second() -> None:
            with jit_cache_turn(folder, job, "run-8", None) as ours:
                order.append(f"second {ours}")
        waiting = threading.Thread(target=second)
        waiting.start()
        waiting.join(0.6)
        assert waiting.is_alive() and order == []      # it waits while the first holds the folder
        order.append("first done")
    waiting.join(5)
    assert order == ["first done", "second True"]
    cancel = threading.Event()
    with jit_cache_turn(folder, job, "run-7", None):
        cancel.set()
        with jit_cache_turn(folder, job, "run-9", cancel) as ours:
            assert ours is False
    with jit_cache_turn(None, job, "run-7", None) as ours:   # no kept workspace: nothing to wait for
        assert ours


@pytest.mark.docker
def test_a_container_run_gets_its_kept_workspace(docker_client, base_image, tmp_path, monkeypatch):
    """The runner mounts the (image, target arch) folder and passes --workspace / --cache-label: the script
    in a real container accepts them (the base image has no FlashInfer: its skip) and the folder exists."""
    from _build_helpers import small_cell
    from _probe_runs import ProbeContext, run_in_container

    from stackforge.edges.gpus import HostGpus
    monkeypatch.setenv("STACKFORGE_JIT_CACHE", str(tmp_path))
    target = Target("rtx-pro-6000-x8-pcie", "RTX PRO 6000", "12.0", 8, Interconnect.PCIE)
    image = ImageRef(ref=base_image, image_id=docker_client.images.get(base_image).id)
    spec = next(s for s in catalog() if s.id == "gate.flashinfer.jit")
    ctx = ProbeContext(run_id="test-jit-cache", target=target, host_gpus=HostGpus(False, "no nvidia-smi"))
    record = run_in_container(docker_client, image, small_cell()[0], spec, ctx)
    assert record.outcome.status is Status.SKIP, record.outcome
    assert record.outcome.reason == "FlashInfer is not installed in this image"
    assert jit_cache_dir(image, target, tmp_path).is_dir()


# --------------------------------------------------------------------------------------------- the real image

def _gate_in(docker_client, image: str, workspace: Path, before: str = "") -> dict:
    """gate.flashinfer.jit's script in ``image``, building only the norm module for sm_120 into ``workspace``."""
    from _probe_runs import script_result_in
    return script_result_in(docker_client, image, "flashinfer_gates.py --arch 12.0 --gpus 8 --interconnect pcie "
                            "--feature flashinfer-jit --build --build-modules norm --build-timeout 900 "
                            "--workspace /stackforge/jit-cache --cache-label test", workspace, before=before)


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.pypi
def test_the_default_13_1_image_builds_flashinfers_norm_module_and_fails_without_its_link_path(
        docker_client, default_13_1_image, tmp_path):
    """The check #31 names: with the image's own environment FlashInfer's norm module compiles and links for
    sm_120; with ``$CUDA_HOME/lib64`` moved away the same objects (kept in the workspace, so only the link
    runs again) no longer link, and the probe fails in the linker's words."""
    built = _gate_in(docker_client, default_13_1_image, tmp_path)
    assert built["status"] == "pass", built
    assert built["metrics"]["evidence_level"] == "built", built
    assert "built (compiled and linked) its norm module" in built["reason"], built["reason"]
    assert "-lcudart" in built["evidence"] and "-lcuda" in built["evidence"]
    relink = ('mv "$CUDA_HOME/lib64" "$CUDA_HOME/lib64.off" && '
              "find /stackforge/jit-cache -name '*.so' -delete && ")
    broken = _gate_in(docker_client, default_13_1_image, tmp_path, before=relink)
    assert broken["status"] == "fail", broken
    assert "norm module does not link for sm_120" in broken["reason"], broken["reason"]
    assert "cannot find -lcudart" in broken["reason"], broken["reason"]


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.pypi
def test_the_default_13_1_image_does_not_build_allreduce_fusion_where_its_sglang_refuses_it(
        docker_client, default_13_1_image, tmp_path):
    """SGLang 0.5.23 (in the image) rejects FlashInfer allreduce fusion on sm_120 in its own code, so the
    gate leaves trtllm_comm unbuilt (minutes saved) and says why; FlashInfer 0.7.2 admitting sm_120 stays
    what it reports, at the ``admitted`` level."""
    from _probe_runs import script_result_in
    result = script_result_in(docker_client, default_13_1_image, "flashinfer_gates.py --arch 12.0 --gpus 8 "
                              "--interconnect pcie --feature flashinfer-ar-fusion --build --build-timeout 900 "
                              "--workspace /stackforge/jit-cache --cache-label test", tmp_path)
    assert result["status"] == "pass", result
    assert result["metrics"]["evidence_level"] == "admitted", result
    assert "builds" not in result["metrics"] or not result["metrics"]["builds"], result["metrics"]
    assert "allreduce-fusion not built: SGLang 0.5.23 rejects the feature for capability 12.0" in result["reason"]
    assert "requires SM90 or SM10X" in result["reason"], result["reason"]
