"""Runtime probe ``p2p-access``: can every pair of the target's GPUs really reach each other's memory?

Two matrices over the first N visible GPUs:

* the driver's claim, ``torch.cuda.can_device_access_peer(i, j)`` (what SGLang trusts with
  SGLANG_SKIP_P2P_CHECK=1);
* a real copy for every ordered pair the driver admits: a 64 MiB int32 pattern copied from GPU i
  to GPU j (``copy_`` between devices goes peer-to-peer once torch enabled peer access), compared
  element by element, with its bandwidth. The copies run in a child process whose every pair is
  a phase with a timeout (``_sfprobe.run_ranks``), because an IOMMU / ACS setup that blocks P2P
  typically hangs the copy or returns garbage while the driver still says yes (the RTX PRO 6000
  case).

``nvidia-smi topo -m`` is recorded as a fact when available, and it tells the host's topology from a
fault: a pair linked across the CPU sockets (``SYS``: PCIe through the inter-socket link) without peer
access is how a dual-socket PCIe box is built, not a broken one (the pairs are listed in the metrics as
``topology_pairs``); a pair the topology connects under one socket (``PIX``, ``PXB``, ``PHB``, ``NODE``,
``NV#``) without access, or any copy the driver admitted that did not arrive intact, is a fault
(``fault_pairs``). Pass when every pair has access and every copy arrived intact; ``undecided`` when the
only gaps are the topology's (this host cannot answer for every pair, and nothing failed); ``fail`` on a
fault. The report blames a collective's failure on the host only for the pairs in ``fault_pairs`` that
the collective used (its ``devices``).
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Sequence
from typing import Any

import _sfprobe as sf

COPY_BYTES = 64 << 20
#: A pair's copy text when an earlier pair hung or crashed the copying process before its turn.
NOT_REACHED = "not reached"


def copy_worker(rank: int, world_size: int, options: dict[str, Any], reporter: sf.RankReporter) -> None:
    """One process copies over every admitted pair; each pair is its own phase (a hang names it)."""
    import torch

    for i, j in options["pairs"]:
        with reporter.attempt(copy_phase(i, j)) as data:
            data.update(copy_check(torch, i, j, options["numel"]))


def copy_phase(i: int, j: int) -> str:
    return f"copy {i}->{j}"


def copy_check(torch: Any, i: int, j: int, numel: int) -> dict[str, Any]:
    """Copy an int32 pattern from GPU i to GPU j and back to the host; raise unless it arrived
    intact. The bandwidth of the device-to-device copy in GB/s (1e9 bytes)."""
    src = (torch.arange(numel, dtype=torch.int32, device=f"cuda:{i}") * 2654435761 + i * 97 + j) & 0x7FFFFFFF
    dst = torch.full((numel,), -1, dtype=torch.int32, device=f"cuda:{j}")
    dst.copy_(src)
    torch.cuda.synchronize(i)
    torch.cuda.synchronize(j)
    wrong = int((dst.cpu() != src.cpu()).sum().item())
    if wrong:
        raise AssertionError(f"{wrong} of {numel} int32 values differ after the copy {i}->{j}")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.device(i):
        start.record()
        for _ in range(5):
            dst.copy_(src)
        end.record()
    end.synchronize()
    seconds = start.elapsed_time(end) / 1e3 / 5
    return {"gbps": round(numel * 4 / seconds / 1e9, 2)}


def main(argv: Sequence[str]) -> None:
    parser = sf.common_parser(__doc__.splitlines()[0])
    parser.add_argument("--phase-timeout", type=float, default=60.0, help="seconds one pair's copy may take")
    parser.add_argument("--copy-bytes", type=int, default=COPY_BYTES)
    args = parser.parse_args(argv)
    status, reason, torch = sf.multi_gpu_preflight("nccl", args.gpus, args.arch)
    facts = sf.collect_facts(torch_module=torch, import_torch=False)
    if status:
        sf.emit(status, reason, facts=facts)
    n = args.gpus
    matrix = [[i == j or bool(torch.cuda.can_device_access_peer(i, j)) for j in range(n)] for i in range(n)]
    topology = nvidia_smi_topology()
    if topology:
        facts = {**facts, "nvidia_smi_topo": topology}
    pairs = [(i, j) for i in range(n) for j in range(n) if i != j and matrix[i][j]]
    outcome = sf.run_ranks(copy_worker, 1, {"pairs": pairs, "numel": max(1, args.copy_bytes // 4)},
                           phase_timeout_s=args.phase_timeout) if pairs else None
    sf.emit_result(decide(n, matrix, pairs, outcome, topology_links(topology)), facts)


#: nvidia-smi topo -m's word for a path between two GPUs through the link between CPU sockets (QPI/UPI,
#: Infinity Fabric). PCIe peer-to-peer across it is not supported on most dual-socket platforms, so no
#: peer access over it is the host's topology, not a fault; every other link kind is under one socket
#: (PIX, PXB, PHB, NODE) or NVLink (NV#), where peer access is expected to work.
CROSS_SOCKET = "SYS"


def topology_links(text: str) -> dict[tuple[int, int], str]:
    """The GPU x GPU links of ``nvidia-smi topo -m`` ({(i, j): "SYS", ...}, both orders); {} without a matrix.

    The container sees only the job's GPUs, numbered from 0 in PCI bus order, as CUDA numbers the target's
    identical cards; the host-side reader is ``stackforge.edges.gpus.parse_topology`` (this runs in the image)."""
    rows = [line.split() for line in text.splitlines() if line.strip()]
    def gpu(cell: str) -> bool:
        return cell.startswith("GPU") and cell[3:].isdigit()

    header = next((cells for cells in rows if len(cells) > 1 and gpu(cells[0]) and gpu(cells[1])), None)
    if header is None:
        return {}
    columns = [int(c[3:]) for c in header if gpu(c)]
    links: dict[tuple[int, int], str] = {}
    for cells in rows:
        if cells is header or not gpu(cells[0]) or len(cells) < len(columns) + 1:
            continue
        i = int(cells[0][3:])
        for j, kind in zip(columns, cells[1:len(columns) + 1]):
            if i != j:
                links[(i, j)] = kind
    return links


def classify_pairs(missing: list[tuple[int, int]], broken: dict[tuple[int, int], str],
                   links: dict[tuple[int, int], str]) -> dict[str, list[list[int]]]:
    """The unordered pairs ``[i, j]`` (i < j, sorted) of each kind: ``topology`` (no access over ``SYS``),
    ``fault`` (no access over any other or an unknown link, or a copy that broke: the driver or the host
    failed where P2P should work) and ``unreached`` (a copy never tried because an earlier one hung or crashed:
    nobody knows, so the report treats them as suspect as a fault)."""
    def key(pair: tuple[int, int]) -> tuple[int, int]:
        return min(pair), max(pair)

    topology = {key(p) for p in missing if links.get(p) == CROSS_SOCKET}
    faults = {key(p) for p in missing if links.get(p) != CROSS_SOCKET}
    faults.update(key(p) for p, text in broken.items() if text != NOT_REACHED)
    unreached = {key(p) for p, text in broken.items() if text == NOT_REACHED} - faults
    return {"topology": [list(p) for p in sorted(topology - faults)], "fault": [list(p) for p in sorted(faults)],
            "unreached": [list(p) for p in sorted(unreached)]}


def decide(n: int, matrix: list[list[bool]], pairs: list[tuple[int, int]],
           outcome: sf.RanksOutcome | None, links: dict[tuple[int, int], str] | None = None) -> sf.ScriptResult:
    """The driver's claim and the copies, as one result with both matrices, judged against the topology."""
    links = links or {}
    copies = copy_results(pairs, outcome)
    lines = ["    " + " ".join(f"{j:>3}" for j in range(n))]
    lines += [f"{i:>3} " + " ".join("  Y" if ok else "  N" for ok in row) for i, row in enumerate(matrix)]
    evidence = "torch.cuda.can_device_access_peer(i, j):\n" + "\n".join(lines)
    evidence += "\ncopies: " + "; ".join(f"{i}->{j} {text}" for (i, j), text in copies.items())
    if outcome is not None:
        evidence += "\n" + outcome.log()
    missing = [(i, j) for i in range(n) for j in range(n) if not matrix[i][j]]
    broken = {pair: text for pair, text in copies.items() if not text.startswith("ok")}
    kinds = classify_pairs(missing, broken, links)
    topology_pairs, fault_pairs = kinds["topology"], kinds["fault"]
    metrics = {"gpus": n, "devices": list(range(n)), "matrix": matrix, "pairs_without_access": len(missing),
               "copies": {f"{i}->{j}": text for (i, j), text in copies.items()}, "pairs_copy_failed": len(broken),
               "links": {f"{i}-{j}": kind for (i, j), kind in sorted(links.items()) if i < j},
               "topology_pairs": topology_pairs, "fault_pairs": fault_pairs, "unreached_pairs": kinds["unreached"]}
    topology_fact = ""
    if topology_pairs:
        shown = ", ".join(f"{i}-{j}" for i, j in topology_pairs[:16])
        topology_fact = (f"no peer access across the CPU sockets for {len(topology_pairs)} pair(s) linked by "
                         f"{CROSS_SOCKET} in nvidia-smi topo -m ({shown}): the host's topology, not a fault")
        metrics["p2p_topology"] = topology_fact
    faulty_missing = [(i, j) for i, j in missing if [min(i, j), max(i, j)] in fault_pairs]
    failure = None
    if faulty_missing:
        shown = ", ".join(f"{i}->{j}" for i, j in faulty_missing[:16])
        failure = f"{len(faulty_missing)} of {n * (n - 1)} GPU pairs have no peer access ({shown})"
        if links:
            failure += " where nvidia-smi topo -m links them under one CPU socket (P2P should work there)"
    if broken:
        shown = "; ".join(f"{i}->{j}: {text}" for (i, j), text in list(broken.items())[:4])
        failure = (f"{failure}; " if failure else "") + (f"the driver admits peer access but {len(broken)} of "
                                                         f"{len(pairs)} copies failed ({shown})")
    if failure:
        return sf.ScriptResult("fail", failure + (f"; {topology_fact}" if topology_fact else ""), evidence, metrics)
    rates = [float(text.split()[1]) for text in copies.values()]
    if topology_fact:
        ok = f"; the {len(copies)} admitted copies arrived intact ({min(rates):.1f}-{max(rates):.1f} GB/s)" \
            if rates else ""
        return sf.ScriptResult("undecided", f"{topology_fact}{ok}; so this host cannot answer for every pair",
                               evidence, metrics)
    return sf.ScriptResult("pass", f"all {n * (n - 1)} ordered pairs of {n} GPUs report peer access and a 64 MiB copy over "
                           f"each arrived intact ({min(rates):.1f}-{max(rates):.1f} GB/s)", evidence, metrics)


def copy_results(pairs: list[tuple[int, int]], outcome: sf.RanksOutcome | None) -> dict[tuple[int, int], str]:
    """``ok <GB/s> GB/s``, the failure in its own words, ``hang ...`` or ``not reached`` per pair."""
    results: dict[tuple[int, int], str] = {}
    for i, j in pairs:
        phase = copy_phase(i, j)
        done = outcome.phase_events(phase) if outcome else ()
        broken = outcome.phase_events(phase, "check-fail") if outcome else ()
        if done:
            results[(i, j)] = f"ok {done[0].data['gbps']} GB/s"
        elif broken:
            results[(i, j)] = broken[0].detail
        elif outcome is not None and outcome.hung is not None and outcome.hung[1] == phase:
            results[(i, j)] = f"hang: no progress for {outcome.hung[2]:.0f} s; the copy was killed"
        elif outcome is not None and outcome.crashed() and any(e.phase == phase for e in outcome.events):
            results[(i, j)] = f"crash: {sf.rank_signal_name(outcome.crashed()[0][1])} during the copy"
        else:
            results[(i, j)] = NOT_REACHED
    return results


def nvidia_smi_topology() -> str:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return ""
    result = sf.run_command([smi, "topo", "-m"], 30)
    return result.stdout.strip()[:4000] if result.ok else ""


if __name__ == "__main__":
    sf.run_main(main, sys.argv[1:])
