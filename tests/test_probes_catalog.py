"""The probe catalog: well-formed, pointing at scripts that exist and accept the arguments it gives."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess

import _probe_venvs as venvs
import pytest

from stackforge.core.errors import SpecError
from stackforge.probes.catalog import (
    SCRIPTS_DIR,
    Preconditions,
    ProbeSpec,
    catalog,
)

PROBES = {spec.id: spec for spec in catalog()}

RULE_FEATURES = {"torch-kernels", "nvcc-codegen", "flashinfer-jit", "flashinfer-ar-fusion", "torch-symm-mem",
                 "custom-allreduce", "kernel-arch-coverage", "nccl-graph-tree", "ep-a2a"}


def test_ids_are_unique_and_scripts_exist():
    specs = catalog()
    assert isinstance(specs, tuple) and specs
    assert len({s.id for s in specs}) == len(specs)
    for spec in specs:
        assert (SCRIPTS_DIR / spec.script).is_file(), spec.script
        assert spec.tier in ("gate", "runtime")
        assert spec.default_timeout_s > 0
        assert spec.description


def test_every_rule_feature_has_a_gate_or_runtime_probe():
    covered = {s.feature for s in catalog()}
    assert RULE_FEATURES <= covered


#: Runtime probes that speak for one GPU; every other runtime probe is a collective (two GPUs at least).
SINGLE_GPU_PROBES = {"runtime.flashinfer.jit"}


def test_runtime_probes_need_a_gpu_of_the_arch_and_collectives_two_gpus():
    for spec in catalog():
        if spec.tier == "runtime":
            assert spec.preconditions.needs_gpu_arch, spec.id
            assert spec.preconditions.min_gpus >= (1 if spec.id in SINGLE_GPU_PROBES else 2), spec.id
        else:
            assert not spec.preconditions.needs_gpu_arch, spec.id


def test_shared_script_specs_pick_their_feature():
    """Two specs may run one script; their fixed args must then say which feature decides."""
    by_script: dict[str, list[ProbeSpec]] = {}
    for spec in catalog():
        by_script.setdefault(spec.script, []).append(spec)
    for script, specs in by_script.items():
        if len(specs) > 1:
            assert len({s.args for s in specs}) == len(specs), script


def test_each_sglang_gate_probe_runs_a_script_of_its_own():
    """One script per SGLang gate feature: a probe evaluates only the feature it is asked about."""
    sglang = [spec for spec in catalog() if spec.id.startswith("gate.sglang.")]
    assert {spec.script for spec in sglang} == {"sglang_symm_mem.py", "sglang_custom_ar.py", "sglang_ar_fusion.py",
                                                   "sglang_jit_gate.py"}
    assert all(spec.args == () for spec in sglang)


def test_specs_are_frozen_and_validated():
    spec = PROBES["gate.flashinfer.ar-fusion"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.tier = "runtime"  # type: ignore[misc]
    with pytest.raises(SpecError):
        ProbeSpec("x", "f", "bench", "x.py", "d")
    with pytest.raises(SpecError):
        ProbeSpec("x", "f", "gate", "../x.py", "d")


def test_preconditions_default_to_none():
    assert Preconditions() == Preconditions(0, False, False, ())
    runtime = PROBES["runtime.nccl.graph-tree"].preconditions
    assert runtime.min_gpus == 2 and runtime.needs_gpu_arch
    assert PROBES["gate.nvcc.codegen"].preconditions.needs_nvcc


@pytest.mark.parametrize("spec", catalog(), ids=lambda s: s.id)
def test_scripts_accept_the_target_and_fixed_arguments(spec):
    """Run each spec's command line in an empty venv: whatever it decides (mostly skip: nothing is
    installed), its arguments must parse and it must end with a result line."""
    python = venvs.bare_venv()
    argv = [str(python), str(SCRIPTS_DIR / spec.script), "--arch", "12.0", "--gpus", "8", "--interconnect", "pcie",
            *spec.args]
    proc = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=spec.default_timeout_s,
                          env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    last = proc.stdout.rstrip("\n").splitlines()[-1]
    assert last.startswith("STACKFORGE_RESULT ")
    payload = json.loads(last.split(" ", 1)[1])
    assert "arguments rejected" not in payload["reason"], payload
    assert payload["status"] in ("pass", "fail", "skip", "error", "undecided")


def test_a_script_may_say_undecided_and_the_runner_keeps_it():
    """``undecided`` (the script could not reach what decides the feature) is a status a script may
    print; the runner records it as such, with the script's reason and evidence."""
    import sys

    from stackforge.core.records import Status
    from stackforge.jobs.job_runner import outcome_from_ending
    from stackforge.probes.execute import probe_kind

    sys.path.insert(0, str(SCRIPTS_DIR))
    try:
        import _sfprobe as sf
    finally:
        sys.path.pop(0)
    line = sf.result_line("undecided", "needs a running server", "ValueError: config namespace 'exec' not published")
    outcome, _ = outcome_from_ending(probe_kind(), exit_code=0, timed_out=False, signal=None,
                                     output=f"log\n{line}\n", duration_s=1.0, timeout_s=60.0)
    assert (outcome.status, outcome.reason) == (Status.UNDECIDED, "needs a running server")
    assert outcome.evidence == "ValueError: config namespace 'exec' not published"
    with pytest.raises(ValueError, match="status must be one of"):
        sf.result_line("maybe", "x")


def test_a_result_line_longer_than_the_kept_tail_is_read_back_from_the_log(tmp_path):
    """A probe's metrics may be long (hundreds of files a cubin wheel lacks code in): the runner keeps only the
    tail of the output, so the line's start (its STACKFORGE_RESULT marker) is cut off there; the job's log still
    has the whole line, and the record is the script's answer, not an error. A reason is bounded to one
    readable line whatever the script passes."""
    import sys

    from stackforge.core.records import Status
    from stackforge.jobs.job_runner import outcome_from_ending, with_result_line
    from stackforge.probes.execute import probe_kind

    sys.path.insert(0, str(SCRIPTS_DIR))
    try:
        import _sfprobe as sf
    finally:
        sys.path.pop(0)
    kind = probe_kind()
    line = sf.result_line("pass", "x " * 50_000, "evidence", {"not_covering": [f"cubins/k{i}.cubin" for i in range(9000)]})
    payload = json.loads(line.split(" ", 1)[1])
    assert len(payload["reason"]) < sf.REASON_LIMIT + 100 and "characters cut" in payload["reason"]
    assert len(line) > kind.tail_chars
    log = tmp_path / "probe.log"
    log.write_text(f"$ docker run image python3 probe.py\nsome output\n{line}\n[stackforge] container exited\n")
    tail = (log.read_text())[-kind.tail_chars:]

    def judged(output: str):
        return outcome_from_ending(kind, exit_code=0, timed_out=False, signal=None, output=output, duration_s=1.0,
                                   timeout_s=60.0)[0]

    assert judged(tail).status is Status.ERROR                        # what the tail alone says
    outcome = judged(with_result_line(tail, log))
    assert outcome.status is Status.PASS and outcome.metrics["not_covering"][-1] == "cubins/k8999.cubin"
    assert with_result_line(tail, None) == tail and with_result_line(tail, tmp_path / "absent.log") == tail
    short = f"out\n{sf.result_line('fail', 'short')}\n"
    assert with_result_line(short, log) == short                      # a whole line in the tail is enough


def test_a_probe_of_a_feature_one_gpu_cannot_have_never_runs_for_one_gpu():
    """compat/knowledge.yaml says the collectives need two GPUs, citing the probes' min_gpus=2: every probe of
    such a feature, gate tier included, is a skip before any container on a one-GPU target (it ran and said
    'fail' for SGLang's refusal of world size 1, or built FlashInfer's allreduce-fusion module no one-GPU
    serving run builds)."""
    from stackforge.core.model import Interconnect, Target
    from stackforge.plan.features import load_feature_catalog

    features = load_feature_catalog()
    one_gpu = Target(name="x1", gpu="GPU", arch="9.0", gpu_count=1, interconnect=Interconnect.PCIE)
    collective = {p.id for p in PROBES.values() if features.spec(p.feature).not_applicable(one_gpu)}
    assert {"gate.sglang.torch-symm-mem", "gate.sglang.custom-allreduce", "gate.flashinfer.ar-fusion",
            "gate.sglang.ar-fusion"} <= collective
    assert {p: PROBES[p].preconditions.min_gpus for p in collective if PROBES[p].preconditions.min_gpus < 2} == {}
