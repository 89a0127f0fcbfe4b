"""``stackforge bench --from-probes``: backends the probes decide are measured only where they passed.

Custom all-reduce on eight PCIe cards and torch symmetric memory on sm_120 are dead ends, so
benchmarking them wastes a GPU hour. With ``--from-probes`` the probe records under
``--results`` decide (as in the matrix: highest tier, worst outcome), and a skipped bench record
names the probe that said no and carries its evidence.
"""

from __future__ import annotations

import json

from click.testing import CliRunner
from matrix_fixtures import record
from test_gpu_assignment import fake_smi

from stackforge.bench import catalog as bench_catalog
from stackforge.bench.run import BenchOptions, gate_on_probes, plan_bench
from stackforge.cli import cli
from stackforge.core.data import resolve_matrix_path
from stackforge.core.records import Status, Tier
from stackforge.edges.gpus import HostGpus
from stackforge.plan.planner import plan_file
from stackforge.probes.catalog import catalog as probe_catalog
from stackforge.results.store import start_run, write_record

STACK_ID = "cu131-torch2.14.1-fi0.7.2-sgl0.5.23-py311-wheels-debian12"
TARGET = "rtx-pro-6000-x8-pcie"
EIGHT_GPUS = HostGpus(True, "8 GPU(s)", ("NVIDIA RTX PRO 6000 Blackwell",) * 8, "590.48.01")
PROBE_FEATURES = frozenset(spec.feature for spec in probe_catalog())


def jobs(*variants: str):
    specs = bench_catalog.select_benches(bench_catalog.catalog(), suites=("allreduce", "gemm"),
                                         allreduce_variants=variants)
    plan = plan_file(resolve_matrix_path(None), targets=(TARGET,), only=(STACK_ID,))
    return plan_bench(plan, specs, BenchOptions(), host_gpus=EIGHT_GPUS, local=False)


def by_variant(gated):
    return {job.spec.id: job for job in gated}


def test_only_backends_the_probes_passed_are_measured():
    records = [
        record(STACK_ID, "custom-allreduce", Status.FAIL, probe="runtime.sglang.custom-allreduce", target=TARGET,
               reason="SGLang disabled it: not supported on more than two PCIe-only GPUs",
               evidence="Custom allreduce is disabled because it's not supported on more than two PCIe-only GPUs"),
        record(STACK_ID, "nccl-graph-tree", Status.PASS, probe="runtime.nccl.graph-tree", target=TARGET),
        record(STACK_ID, "torch-symm-mem", Status.PASS, tier=Tier.GATE, probe="gate.sglang.torch-symm-mem",
               target=TARGET),
        record(STACK_ID, "torch-symm-mem", Status.FAIL, probe="runtime.torch.symm-mem", target=TARGET,
               reason="rendezvous failed", evidence="CUDA error: operation not supported"),
    ]
    gated = by_variant(gate_on_probes(jobs("nccl", "nccl-tree", "custom", "symm-mem"), records, PROBE_FEATURES))
    assert gated["bench.allreduce.nccl"].skip_reason is None, "no probe speaks for plain NCCL: kept"
    assert gated["bench.gemm"].skip_reason is None
    assert gated["bench.allreduce.nccl-tree"].skip_reason is None
    custom = gated["bench.allreduce.custom"]
    assert custom.skip_reason == ("--from-probes: runtime probe runtime.sglang.custom-allreduce says custom-allreduce "
                                  "is fail: SGLang disabled it: not supported on more than two PCIe-only GPUs")
    assert "two PCIe-only GPUs" in custom.skip_evidence
    symm = gated["bench.allreduce.symm-mem"]
    assert "runtime probe runtime.torch.symm-mem says torch-symm-mem is fail" in symm.skip_reason, \
        "the runtime tier outranks the gate's pass"


def test_a_backend_without_probe_records_is_not_measured():
    gated = by_variant(gate_on_probes(jobs("custom"), [], PROBE_FEATURES))
    assert gated["bench.allreduce.custom"].skip_reason.startswith(
        "--from-probes: no probe result for custom-allreduce on rtx-pro-6000-x8-pcie")


def test_probes_that_only_skipped_or_stayed_undecided_keep_the_backend_unmeasured():
    skipped = [record(STACK_ID, "custom-allreduce", Status.SKIP, tier=Tier.GATE, probe="gate.sglang.custom-allreduce",
                      target=TARGET, reason="SGLang is not installed in this image", evidence="import sglang")]
    custom = by_variant(gate_on_probes(jobs("custom"), skipped, PROBE_FEATURES))["bench.allreduce.custom"]
    assert custom.skip_reason == ("--from-probes: gate says custom-allreduce is skip: "
                                  "SGLang is not installed in this image")
    assert custom.skip_evidence == "import sglang"
    undecided = [record(STACK_ID, "custom-allreduce", Status.UNDECIDED, tier=Tier.GATE,
                        probe="gate.sglang.custom-allreduce", target=TARGET, reason="needs a running server",
                        evidence="server context")]
    custom = by_variant(gate_on_probes(jobs("custom"), undecided, PROBE_FEATURES))["bench.allreduce.custom"]
    assert custom.skip_reason == ("--from-probes: the probes leave custom-allreduce undecided: "
                                  "undecided by gate.sglang.custom-allreduce: needs a running server")
    assert custom.skip_evidence == "server context"


def test_records_of_other_stacks_targets_and_benches_do_not_count():
    records = [record("cu128-other", "custom-allreduce", Status.PASS, target=TARGET),
               record(STACK_ID, "custom-allreduce", Status.PASS, target="h100-x8-nvswitch"),
               record(STACK_ID, "custom-allreduce", Status.PASS, tier=Tier.BENCH, target=TARGET)]
    gated = by_variant(gate_on_probes(jobs("custom"), records, PROBE_FEATURES))
    assert gated["bench.allreduce.custom"].skip_reason.startswith("--from-probes: no probe result")


def test_cli_from_probes_writes_a_skip_record_with_the_probes_evidence(tmp_path, monkeypatch):
    """The whole command: probe records in a results folder, then a bench run that skips custom
    all-reduce with the probe's words (an sm_120 host is simulated by an nvidia-smi on PATH)."""
    fake_smi(tmp_path, monkeypatch, [f"{i}, NVIDIA RTX PRO 6000 Blackwell, 590.48.01, 12.0" for i in range(8)])
    results = tmp_path / "results"
    probe_run = start_run(results, command=["stackforge", "probe"], matrix_source="default", run_id="20261129T000000Z-probe")
    write_record(probe_run, record(STACK_ID, "custom-allreduce", Status.FAIL, probe="runtime.sglang.custom-allreduce",
                                   target=TARGET, reason="SGLang disabled it on PCIe", evidence="two PCIe-only GPUs"))
    outcome = CliRunner().invoke(cli, ["bench", "--local", "--only", STACK_ID, "--target", TARGET,
                                       "--suite", "allreduce", "--allreduce-backend", "custom", "--from-probes",
                                       "--results", str(results)])
    assert outcome.exit_code == 0, outcome.output
    bench_runs = [d for d in results.iterdir() if d.name != probe_run.name]
    (written,) = [json.loads(p.read_text()) for p in bench_runs[0].glob("*/*/*.json")]     # records, not run.json / host.json
    assert json.loads((bench_runs[0] / "host.json").read_text())["gpus"][0]["arch"] == "12.0"
    assert written["outcome"]["status"] == "skip"
    assert written["outcome"]["reason"].startswith("--from-probes: runtime probe runtime.sglang.custom-allreduce")
    assert written["outcome"]["evidence"] == "two PCIe-only GPUs"


def test_cli_from_probes_without_results_is_a_clear_error(tmp_path):
    outcome = CliRunner().invoke(cli, ["bench", "--local", "--only", STACK_ID, "--from-probes",
                                       "--results", str(tmp_path / "none")])
    assert outcome.exit_code == 2, outcome.output
    assert "results folder does not exist" in outcome.output and "stackforge probe" in outcome.output
