"""The probes as data: which script decides which feature, in which tier, under which preconditions.

A :class:`ProbeSpec` names one probe: its id (the ``probe`` field of a result record), the feature
it speaks for (the same names the rules in ``compat/`` use), its tier, the script under
``stackforge/probes/scripts`` and that script's fixed arguments. The runner appends the target's
arguments (``--arch 12.0 --gpus 8 --interconnect pcie``) to every script; ``args`` are only the
fixed ones that pick a variant (``--feature flashinfer-ar-fusion``, ``--algo tree``).

Preconditions say when running a probe makes sense at all: ``min_gpus`` (GPUs in the target),
``needs_gpu_arch`` (a GPU of the target arch must be visible: the runtime tier), ``needs_nvcc`` and
``needs_packages`` (installed distributions). Every script also checks what it needs itself and
reports an unmet need as ``skip`` with the reason. Where a job is scheduled
(:func:`stackforge.probes.execute.plan_probe_job`) the preconditions the host and target decide
(GPUs of the target's arch on the host, ``min_gpus``) turn the job into a ``skip`` before a container
starts; what the image holds (nvcc, packages) only the script can see.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from stackforge.core.errors import SpecError
from stackforge.plan.rules import FEATURES

#: The in-image probe scripts (mounted read-only at /stackforge/probes, never baked into images).
SCRIPTS_DIR = Path(__file__).resolve().parent / "scripts"
TIERS = ("gate", "runtime")


@dataclass(frozen=True, slots=True)
class Preconditions:
    """When a probe can say anything.

    Attributes:
        min_gpus: the target must have at least this many GPUs.
        needs_gpu_arch: a GPU of the target's arch must be visible to the probe (runtime tier).
        needs_nvcc: the image must contain nvcc.
        needs_packages: distributions that must be installed in the image (``flashinfer-python``).
    """

    min_gpus: int = 0
    needs_gpu_arch: bool = False
    needs_nvcc: bool = False
    needs_packages: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ProbeSpec:
    """One probe.

    Attributes:
        id: record key (``probe`` field of a result), unique, e.g. ``gate.flashinfer.ar-fusion``.
        feature: the feature the result speaks for, e.g. ``flashinfer-ar-fusion``.
        tier: ``gate`` (no GPU needed) or ``runtime`` (GPU of the target arch).
        script: file name under :data:`SCRIPTS_DIR`.
        description: one line for listings.
        preconditions: see :class:`Preconditions`.
        default_timeout_s: hard timeout of the whole script (the runner kills it after that).
        args: fixed script arguments, appended after the target's arguments.
        jit_cache: the script takes ``--workspace DIR --cache-label RUN``: in a container the runner mounts a
            kept per-(image, target arch) JIT build cache there (:func:`stackforge.jobs.job_runner.jit_cache_mount`).
    """

    id: str
    feature: str
    tier: str
    script: str
    description: str
    preconditions: Preconditions = Preconditions()
    default_timeout_s: float = 300.0
    args: tuple[str, ...] = ()
    jit_cache: bool = False

    @property
    def needs_gpu(self) -> bool:
        """Runtime probes get the host GPUs of the target's arch; gate probes none (their arch comes
        from ``--target``, so a visible card of another arch cannot colour the answer)."""
        return self.tier == "runtime"

    def __post_init__(self) -> None:
        if self.tier not in TIERS:
            raise SpecError(f"probe {self.id}: tier must be one of {', '.join(TIERS)}, got {self.tier!r}")
        if "/" in self.script or not self.script.endswith(".py"):
            raise SpecError(f"probe {self.id}: script must be a .py file name, got {self.script!r}")


_RUNTIME = Preconditions(min_gpus=2, needs_gpu_arch=True, needs_packages=("torch",))

_CATALOG: tuple[ProbeSpec, ...] = (
    ProbeSpec("gate.torch.arch-list", "torch-kernels", "gate", "torch_arch.py",
              "torch's compiled arch list (torch._C._cuda_getArchFlags) has SASS or PTX for the target",
              Preconditions(needs_packages=("torch",)), 120.0),
    ProbeSpec("gate.nvcc.codegen", "nvcc-codegen", "gate", "nvcc_codegen.py",
              "the image's nvcc compiles a kernel to an sm_XY cubin (sm_XYa / sm_XYf / PTX as metrics)",
              Preconditions(needs_nvcc=True), 300.0),
    # The builds get --build-timeout in all; the script's hard timeout leaves room for the imports,
    # the gates and the result line after a build stopped at its limit (a build timeout is the script's).
    ProbeSpec("gate.flashinfer.jit", "flashinfer-jit", "gate", "flashinfer_gates.py",
              "FlashInfer's own arch resolution and JIT module gates for the target; builds (compiles and links, "
              "nothing loaded or run) its norm, sampling and decode-attention modules when the image has nvcc",
              Preconditions(needs_packages=("flashinfer-python",)), 1500.0,
              ("--feature", "flashinfer-jit", "--build", "--build-timeout", "1200"), jit_cache=True),
    ProbeSpec("gate.flashinfer.ar-fusion", "flashinfer-ar-fusion", "gate", "flashinfer_gates.py",
              "FlashInfer's gen_trtllm_comm_module (allreduce fusion) gate for the target arch; builds the "
              "module (compiles and links, nothing loaded or run) when the image has nvcc and its SGLang does not "
              "reject the fusion on the target (then no serving run builds it)",
              Preconditions(min_gpus=2, needs_packages=("flashinfer-python",)), 1500.0,
              ("--feature", "flashinfer-ar-fusion", "--build", "--build-timeout", "1200"), jit_cache=True),
    ProbeSpec("gate.sglang.jit", "sglang-jit", "gate", "sglang_jit_gate.py",
              "SGLang's own JIT loader builds (compiles and links for the target arch, nothing run) the kernel every "
              "CUDA serving run JIT-builds first (the KV-cache store_cache kernel); skip where the release has none",
              Preconditions(needs_packages=("sglang",)), 900.0, jit_cache=True),  # the script's own budget: 600 s
    ProbeSpec("gate.sglang.torch-symm-mem", "torch-symm-mem", "gate", "sglang_symm_mem.py",
              "SGLang's TorchSymmMemCommunicator gate (capability table, world size) for the target",
              Preconditions(min_gpus=2, needs_packages=("sglang",)), 300.0),
    ProbeSpec("gate.sglang.custom-allreduce", "custom-allreduce", "gate", "sglang_custom_ar.py",
              "SGLang's CustomAllreduce gates (world size, more than two PCIe-only GPUs) for the target",
              Preconditions(min_gpus=2, needs_packages=("sglang",)), 300.0),
    ProbeSpec("gate.sglang.ar-fusion", "flashinfer-ar-fusion", "gate", "sglang_ar_fusion.py",
              "SGLang's own FlashInfer allreduce-fusion arch gate (_resolve_backend, 0.5.14+) and ServerArgs "
              "turning the fusion on by itself (0.5.4.post2-0.5.7 on sm_12x), with FlashInfer's gate, for the target",
              Preconditions(min_gpus=2, needs_packages=("sglang",)), 300.0),
    ProbeSpec("gate.kernels.arch-coverage", "kernel-arch-coverage", "gate", "kernel_cubins.py",
              "SASS/PTX archs in sgl-kernel / flashinfer-cubin / flashinfer-jit-cache shared objects, judged for "
              "the kernels the target would use (SM10x-only FlashInfer cubin families listed as excluded)",
              Preconditions(), 600.0),
    ProbeSpec("gate.stack.imports", "stack-imports", "gate", "stack_imports.py",
              "every compiled module of the stack loads against its torch (torch._C, sgl-kernel's library for the "
              "target, FlashInfer AOT / jit-cache modules, DeepGEMM, DeepEP; libcuda.so.1 from the CUDA link stub) "
              "and SGLang's server entry modules import; each failure names the file and the undefined symbol",
              Preconditions(), 1200.0),
    ProbeSpec("runtime.flashinfer.jit", "flashinfer-jit", "runtime", "flashinfer_run.py",
              "FlashInfer JIT-builds rmsnorm and single-request decode attention for the visible GPU (fresh "
              "cache) and runs them; results checked against torch",
              Preconditions(min_gpus=1, needs_gpu_arch=True, needs_packages=("torch", "flashinfer-python")), 1800.0),
    ProbeSpec("runtime.nccl.graph-tree", "nccl-graph-tree", "runtime", "nccl_graph.py",
              "NCCL all_reduce with NCCL_ALGO=allreduce:tree, eager and replayed from a CUDA graph, N ranks",
              _RUNTIME, 900.0, ("--algo", "tree", "--backend", "nccl")),
    ProbeSpec("runtime.nccl.global-tree", "nccl-global-tree", "runtime", "nccl_graph.py",
              "NCCL with a global NCCL_ALGO=Tree: all_reduce, all_gather, reduce_scatter, broadcast, each eager "
              "and replayed from a CUDA graph, N ranks; NCCL's own words for each collective it refuses",
              _RUNTIME, 900.0, ("--algo", "tree", "--variant", "global", "--backend", "nccl")),
    ProbeSpec("runtime.nccl.graph-ring", "nccl-graph-ring", "runtime", "nccl_graph.py",
              "NCCL all_reduce with NCCL_ALGO=allreduce:ring, eager and replayed from a CUDA graph, N ranks",
              _RUNTIME, 900.0, ("--algo", "ring", "--backend", "nccl")),
    ProbeSpec("runtime.torch.symm-mem", "torch-symm-mem", "runtime", "symm_mem.py",
              "torch symmetric memory rendezvous, multicast, one-shot / two-shot / multimem all-reduce",
              _RUNTIME, 900.0),
    ProbeSpec("runtime.sglang.custom-allreduce", "custom-allreduce", "runtime", "custom_allreduce.py",
              "SGLang custom all-reduce vs NCCL: correctness and latency, P2P matrix as facts (its first JIT "
              "compile in a phase of its own, up to 600 s)",
              Preconditions(min_gpus=2, needs_gpu_arch=True, needs_packages=("torch", "sglang")), 1500.0),
    ProbeSpec("runtime.ep.all-to-all", "ep-a2a", "runtime", "ep_all_to_all.py",
              "MoE expert-parallel dispatch/combine with the backend SGLang's --moe-a2a-backend would run: DeepEP's "
              "intranode Buffer round where installed (skip without one); all_to_all_single as metrics",
              _RUNTIME, 900.0, ("--backend", "nccl")),
    ProbeSpec("runtime.torch.all-to-all", "torch-a2a", "runtime", "ep_all_to_all.py",
              "MoE expert-parallel dispatch/combine with torch's all_to_all_single (uneven splits, every row "
              "checked), eager and replayed from a CUDA graph",
              _RUNTIME, 900.0, ("--backend", "nccl", "--decide-by", "torch", "--no-deepep")),
    ProbeSpec("runtime.cuda.p2p-matrix", "p2p-access", "runtime", "p2p_matrix.py",
              "torch.cuda.can_device_access_peer for every pair of the target's GPUs, and a 64 MiB copy over each "
              "pair it admits, checked element by element (a hang names the pair)",
              _RUNTIME, 300.0),
)


def catalog() -> tuple[ProbeSpec, ...]:
    """Every probe stackforge knows, gate tier first."""
    return _CATALOG


def known_features(probes: Sequence[ProbeSpec] = _CATALOG) -> tuple[str, ...]:
    """Every feature name: the rules' vocabulary first, then those only a probe decides."""
    return tuple(dict.fromkeys((*FEATURES, *(spec.feature for spec in probes))))

