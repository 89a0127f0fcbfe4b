"""Runtime probe ``p2p-access``: can every pair of the target's GPUs access each other's memory?

Builds the ``torch.cuda.can_device_access_peer(i, j)`` matrix over the first N visible GPUs (what
the driver reports; SGLang trusts exactly this with SGLANG_SKIP_P2P_CHECK=1) and records
``nvidia-smi topo -m`` as a fact when available. Pass when every pair has access.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Sequence

import _sfprobe as sf


def main(argv: Sequence[str]) -> None:
    args = sf.common_parser(__doc__.splitlines()[0]).parse_args(argv)
    status, reason, torch = sf.multi_gpu_preflight("nccl", args.gpus, args.arch)
    facts = sf.collect_facts(torch_module=torch, import_torch=False)
    if status:
        sf.emit(status, reason, facts=facts)
    n = args.gpus
    matrix = [[i == j or bool(torch.cuda.can_device_access_peer(i, j)) for j in range(n)] for i in range(n)]
    topology = nvidia_smi_topology()
    if topology:
        facts = {**facts, "nvidia_smi_topo": topology}
    lines = ["    " + " ".join(f"{j:>3}" for j in range(n))]
    lines += [f"{i:>3} " + " ".join("  Y" if ok else "  N" for ok in row) for i, row in enumerate(matrix)]
    evidence = "torch.cuda.can_device_access_peer(i, j):\n" + "\n".join(lines)
    missing = [(i, j) for i in range(n) for j in range(n) if not matrix[i][j]]
    metrics = {"gpus": n, "matrix": matrix, "pairs_without_access": len(missing)}
    if missing:
        shown = ", ".join(f"{i}->{j}" for i, j in missing[:16])
        sf.emit("fail", f"{len(missing)} of {n * (n - 1)} GPU pairs have no peer access ({shown})", evidence, metrics,
                facts)
    sf.emit("pass", f"all {n * (n - 1)} ordered pairs of {n} GPUs report peer access", evidence, metrics, facts)


def nvidia_smi_topology() -> str:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return ""
    result = sf.run_command([smi, "topo", "-m"], 30)
    return result.stdout.strip()[:4000] if result.ok else ""


if __name__ == "__main__":
    sf.run_main(main, sys.argv[1:])
