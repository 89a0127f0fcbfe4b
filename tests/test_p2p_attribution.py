"""A collective's failure is the host's only where the host's P2P failed for the GPUs it used.

On a dual-socket 8-GPU PCIe box (GPU0-3 under one CPU, GPU4-7 under the other) the cards have no peer
access across the sockets: ``nvidia-smi topo -m`` says ``SYS`` there. That is the host's topology, not a
fault: the P2P probe records it as a fact (``undecided``, ``topology_pairs``), and NCCL's own Tree refusal,
torch's "no multicast" and a hang of that run stay verdicts on the stack (the dead-end list keeps every
entry). A P2P fault (a copy that hangs where the topology says P2P works) blames only the collectives that
used that pair, or whose own words name P2P / IPC. Bench failures are judged the same way, from the run's
host check in ``host.json``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from matrix_fixtures import CU128, TARGET, plan_dict, record, seed_records

from stackforge.edges.gpus import parse_topology
from stackforge.plan.features import load_feature_catalog
from stackforge.plan.planner import Plan
from stackforge.report.compat_matrix import CellStatus, build_matrix, host_check_faults, names_p2p, p2p_fault_pairs
from stackforge.report.deadends import find_dead_ends

SCRIPTS = Path(__file__).resolve().parents[1] / "stackforge" / "probes" / "scripts"
RUN = "20260301T020000Z-aaaaaa"   # matrix_fixtures.record's run: the seed's collectives ran in it

#: nvidia-smi topo -m of a dual-socket PCIe server with eight cards, four per socket, one NIC on socket 0.
DUAL_SOCKET_TOPO = """\
\tGPU0\tGPU1\tGPU2\tGPU3\tGPU4\tGPU5\tGPU6\tGPU7\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID
GPU0\t X \tPIX\tNODE\tNODE\tSYS\tSYS\tSYS\tSYS\tNODE\t0-31,64-95\t0\t\tN/A
GPU1\tPIX\t X \tNODE\tNODE\tSYS\tSYS\tSYS\tSYS\tNODE\t0-31,64-95\t0\t\tN/A
GPU2\tNODE\tNODE\t X \tPIX\tSYS\tSYS\tSYS\tSYS\tNODE\t0-31,64-95\t0\t\tN/A
GPU3\tNODE\tNODE\tPIX\t X \tSYS\tSYS\tSYS\tSYS\tNODE\t0-31,64-95\t0\t\tN/A
GPU4\tSYS\tSYS\tSYS\tSYS\t X \tPIX\tNODE\tNODE\tSYS\t32-63,96-127\t1\t\tN/A
GPU5\tSYS\tSYS\tSYS\tSYS\tPIX\t X \tNODE\tNODE\tSYS\t32-63,96-127\t1\t\tN/A
GPU6\tSYS\tSYS\tSYS\tSYS\tNODE\tNODE\t X \tPIX\tSYS\t32-63,96-127\t1\t\tN/A
GPU7\tSYS\tSYS\tSYS\tSYS\tNODE\tNODE\tPIX\t X \tSYS\t32-63,96-127\t1\t\tN/A
NIC0\tNODE\tNODE\tNODE\tNODE\tSYS\tSYS\tSYS\tSYS\t X \t\t\t\t

Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks

NIC Legend:

  NIC0: mlx5_0
"""


@pytest.fixture(scope="module")
def p2p():
    sys.path.insert(0, str(SCRIPTS))
    try:
        import p2p_matrix
    finally:
        sys.path.pop(0)
    return p2p_matrix


def socket_of(gpu: int) -> int:
    return gpu // 4


def dual_socket_result(p2p, hang: tuple[int, int] | None = None):
    """What the P2P probe decides on the dual-socket box: the driver refuses every pair across the sockets,
    every copy within a socket arrives (or ``hang`` hangs and the copies after it are never reached)."""
    sf = p2p.sf
    n = 8
    matrix = [[i == j or socket_of(i) == socket_of(j) for j in range(n)] for i in range(n)]
    pairs = [(i, j) for i in range(n) for j in range(n) if i != j and matrix[i][j]]
    events = []
    for pair in pairs:
        if pair == hang:
            events.append(sf.RankEvent(0, p2p.copy_phase(*pair), "start"))
            break
        events.append(sf.RankEvent(0, p2p.copy_phase(*pair), "ok", data={"gbps": 25.1}))
    hung = (0, p2p.copy_phase(*hang), 61.0) if hang else None
    outcome = sf.RanksOutcome(tuple(events), (-9,) if hang else (0,), hung, ())
    return p2p.decide(n, matrix, pairs, outcome, p2p.topology_links(DUAL_SOCKET_TOPO))


def as_record(result, stack_id: str = CU128):
    return record(stack_id, "p2p-access", result.status, probe="runtime.cuda.p2p-matrix", reason=result.reason,
                  evidence=result.evidence, metrics=dict(result.metrics))


def test_the_in_image_topology_reader_agrees_with_the_host_one(p2p):
    links = p2p.topology_links(DUAL_SOCKET_TOPO)
    host = parse_topology(DUAL_SOCKET_TOPO)
    assert host is not None and {(i, j): kind for i, j, kind in host} == {k: v for k, v in links.items() if k[0] < k[1]}
    assert links[(0, 1)] == "PIX" and links[(0, 2)] == "NODE" and links[(3, 4)] == "SYS" and links[(4, 3)] == "SYS"
    assert p2p.topology_links("NVIDIA-SMI has failed") == {}


def test_no_p2p_across_the_sockets_is_the_hosts_topology_not_a_fault(p2p):
    result = dual_socket_result(p2p)
    assert result.status == "undecided"
    assert len(result.metrics["topology_pairs"]) == 16 and result.metrics["fault_pairs"] == []
    assert [0, 4] in result.metrics["topology_pairs"] and [0, 1] not in result.metrics["topology_pairs"]
    assert result.reason.startswith("no peer access across the CPU sockets for 16 pair(s) linked by SYS in "
                                    "nvidia-smi topo -m (0-4, 0-5")
    assert "the host's topology, not a fault; the 24 admitted copies arrived intact (25.1-25.1 GB/s)" in result.reason
    assert result.metrics["devices"] == list(range(8)) and result.metrics["links"]["3-4"] == "SYS"
    # The same refusals between two cards of one socket are a fault: the topology says P2P works there.
    refused = [[i == j or socket_of(i) == socket_of(j) and {i, j} != {0, 1} for j in range(8)] for i in range(8)]
    pairs = [(i, j) for i in range(8) for j in range(8) if i != j and refused[i][j]]
    sf = p2p.sf
    copies = sf.RanksOutcome(tuple(sf.RankEvent(0, p2p.copy_phase(*pr), "ok", data={"gbps": 25.0}) for pr in pairs),
                             (0,), None, ())
    fault = p2p.decide(8, refused, pairs, copies, p2p.topology_links(DUAL_SOCKET_TOPO))
    assert fault.status == "fail" and fault.metrics["fault_pairs"] == [[0, 1]]
    assert fault.reason.startswith("2 of 56 GPU pairs have no peer access (0->1, 1->0) where nvidia-smi topo -m links "
                                   "them under one CPU socket")


def test_the_dead_end_list_keeps_every_entry_on_a_dual_socket_box(p2p):
    """The seed's collectives failed in the run whose P2P probe met the dual-socket topology: NCCL's own Tree
    hang, torch's symmetric-memory abort and FlashInfer's fusion JIT stay dead ends, as without the probe."""
    plan = Plan.from_json(plan_dict())
    without = find_dead_ends(build_matrix(seed_records(), plan, TARGET)).features()
    topology = as_record(dual_socket_result(p2p))
    report = build_matrix([*seed_records(), topology], plan, TARGET)
    assert find_dead_ends(report).features() == without
    assert without == ("flashinfer-jit", "flashinfer-ar-fusion", "torch-symm-mem", "nccl-graph-tree")
    row = report.row(CU128)
    assert row.cell("nccl-graph-tree").status is CellStatus.TIMEOUT
    assert row.cell("torch-symm-mem").status is CellStatus.CRASH
    p2p_cell = row.cell("p2p-access")
    assert p2p_cell.status is CellStatus.UNDECIDED and not p2p_cell.dead
    assert "no peer access across the CPU sockets" in p2p_cell.reason


def test_nccl_and_torch_refusals_stay_verdicts_beside_a_topology_gap(p2p):
    refusal = record(CU128, "nccl-global-tree", "fail", probe="runtime.nccl.global-tree",
                     reason="NCCL refused all_gather under NCCL_ALGO=Tree: no algorithm/protocol available",
                     metrics={"ranks": 8, "devices": list(range(8))})
    multicast = record(CU128, "torch-symm-mem", "fail", probe="runtime.torch.symm-mem",
                       reason="multimem all-reduce: no multicast support on this device (CU_DEVICE_ATTRIBUTE_"
                              "MULTICAST_SUPPORTED=0)")
    report = build_matrix([refusal, multicast, as_record(dual_socket_result(p2p))], Plan.from_json(plan_dict()),
                          TARGET, features=("nccl-global-tree", "torch-symm-mem", "p2p-access"))
    row = report.row(CU128)
    assert row.cell("nccl-global-tree").status is CellStatus.FAIL
    assert row.cell("torch-symm-mem").status is CellStatus.FAIL


def test_a_p2p_fault_blames_only_the_collectives_that_used_the_pair(p2p):
    """Copy 4->5 hangs (PIX: P2P should work there); the copies after it are never reached (suspect)."""
    faulty = dual_socket_result(p2p, hang=(4, 5))
    assert faulty.status == "fail" and faulty.metrics["fault_pairs"] == [[4, 5]]
    assert [6, 7] in faulty.metrics["unreached_pairs"] and [0, 1] not in faulty.metrics["unreached_pairs"]
    assert [0, 4] in faulty.metrics["topology_pairs"]
    on_all = record(CU128, "nccl-graph-ring", "timeout", probe="runtime.nccl.graph-ring",
                    reason="killed at its 900 s timeout")                         # no metrics: the run's GPUs
    socket1 = record(CU128, "nccl-graph-tree", "fail", probe="runtime.nccl.graph-tree",
                     reason="NCCL refused Tree under graph capture", metrics={"devices": [4, 5, 6, 7]})
    socket0 = record(CU128, "custom-allreduce", "fail", probe="runtime.sglang.custom-allreduce",
                     reason="SGLang disabled it: more than two PCIe-only GPUs", metrics={"devices": [0, 1, 2, 3]})
    pair = record(CU128, "torch-symm-mem", "fail", probe="runtime.torch.symm-mem", reason="rendezvous refused",
                  metrics={"devices": [2, 3]})
    report = build_matrix([as_record(faulty), on_all, socket1, socket0, pair], Plan.from_json(plan_dict()), TARGET,
                          features=("p2p-access", "nccl-graph-ring", "nccl-graph-tree", "custom-allreduce",
                                    "torch-symm-mem"))
    row = report.row(CU128)
    ring = row.cell("nccl-graph-ring")
    assert ring.status is CellStatus.UNDECIDED
    assert ring.reason.startswith("undecided by runtime.nccl.graph-ring: p2p-access fails on this host in the same "
                                  "run (runtime.cuda.p2p-matrix: the driver admits peer access but ")
    assert "; it used GPU pairs that failed (4-5, 4-6" in ring.reason
    assert "this timeout is the host's, not a verdict on the stack: killed at its 900 s timeout" in ring.reason
    assert row.cell("nccl-graph-tree").status is CellStatus.UNDECIDED          # it used 4-5
    assert row.cell("custom-allreduce").status is CellStatus.FAIL              # socket 0 copied intact: a verdict
    assert row.cell("torch-symm-mem").status is CellStatus.FAIL
    assert row.cell("p2p-access").status is CellStatus.FAIL


def test_own_words_name_p2p_only_in_a_run_where_the_host_failed(p2p):
    """A fault only between 0 and 1: a failure on GPUs 6-7 is the host's only if it names P2P / IPC."""
    sf = p2p.sf
    matrix = [[True] * 8 for _ in range(8)]
    pairs = [(i, j) for i in range(8) for j in range(8) if i != j]
    events = tuple(sf.RankEvent(0, p2p.copy_phase(*pr), "check-fail", "AssertionError: 3 of 16 int32 values differ")
                   if pr == (0, 1) else sf.RankEvent(0, p2p.copy_phase(*pr), "ok", data={"gbps": 30.0}) for pr in pairs)
    result = p2p.decide(8, matrix, pairs, sf.RanksOutcome(events, (0,), None, ()), p2p.topology_links(DUAL_SOCKET_TOPO))
    assert result.metrics["fault_pairs"] == [[0, 1]] and result.metrics["unreached_pairs"] == []
    ipc = record(CU128, "custom-allreduce", "fail", probe="runtime.sglang.custom-allreduce",
                 reason="cudaIpcOpenMemHandle failed: invalid argument", metrics={"devices": [6, 7]})
    refusal = record(CU128, "nccl-graph-tree", "fail", probe="runtime.nccl.graph-tree",
                     reason="NCCL refused Tree", evidence="NCCL INFO Channel 00 : 6[6] -> 7[7] via P2P/IPC",
                     metrics={"devices": [6, 7]})
    features = ("custom-allreduce", "nccl-graph-tree")
    row = build_matrix([as_record(result), ipc, refusal], Plan.from_json(plan_dict()), TARGET,
                       features=features).row(CU128)
    ipc_cell = row.cell("custom-allreduce")    # undecided by its probe: the rule's hazard shows, with why
    assert ipc_cell.status is CellStatus.HAZARD and not ipc_cell.records[0].outcome.status.value == "fail"
    assert "its own words name cudaIpcOpenMemHandle; this fail is the host's" in ipc_cell.undecided
    assert row.cell("nccl-graph-tree").status is CellStatus.FAIL           # "via P2P/IPC" is in the log only
    # The same words with no host fault in the run (no P2P probe) stay the stack's.
    alone = build_matrix([ipc], Plan.from_json(plan_dict()), TARGET, features=features).row(CU128)
    assert alone.cell("custom-allreduce").status is CellStatus.FAIL


def test_bench_failures_get_the_same_host_attribution():
    """A bench run carries no P2P probe: its host check (host.json) says what failed on the host."""
    bandwidth = record(CU128, "allreduce-bandwidth", "timeout", tier="bench", probe="bench.allreduce.nccl",
                       reason="killed at its 3600 s timeout", metrics={"world_size": 8})
    gemm = record(CU128, "gemm-throughput", "fail", tier="bench", probe="bench.gemm", reason="fp8 GEMM wrong",
                  metrics={"devices": [0]})
    serve_tp2 = record(CU128, "serving-throughput", "fail", tier="bench", probe="bench.serve",
                       reason="server died", metrics={"tp": 2})
    plan = Plan.from_json(plan_dict())
    features = ("allreduce-bandwidth", "gemm-throughput", "serving-throughput")
    records = [bandwidth, gemm, serve_tp2]
    uvm = {RUN: {"check": {"status": "fail", "p2p": True, "p2p_pairs": [[4, 5]],
                           "reason": "nvidia_uvm uvm_disable_hmm=0: P2P hangs on this board without it"}}}
    row = build_matrix(records, plan, TARGET, features=features, hosts=uvm).row(CU128)
    assert row.cell("allreduce-bandwidth").status is CellStatus.UNDECIDED
    assert row.cell("allreduce-bandwidth").reason.startswith(
        "undecided by bench.allreduce.nccl: the host check of this run failed (nvidia_uvm uvm_disable_hmm=0")
    assert row.cell("gemm-throughput").status is CellStatus.FAIL            # one GPU: no P2P in it
    assert row.cell("serving-throughput").status is CellStatus.FAIL         # TP over 0-1: not the failing pair
    wedged = {RUN: {"check": {"status": "fail", "reason": "persistence mode off and Fabric Manager stopped"}}}
    row = build_matrix(records, plan, TARGET, features=features, hosts=wedged).row(CU128)
    assert all(row.cell(f).status is CellStatus.UNDECIDED for f in features)   # every GPU failed the check
    # On listed GPUs (nvidia-smi's host indices) the job runner judged each job against its own cards.
    one_card = {RUN: {"check": {"status": "fail", "gpus": [1], "reason": "GPU 1 fell off the bus (Xid 79)"}}}
    row = build_matrix(records, plan, TARGET, features=features, hosts=one_card).row(CU128)
    assert [row.cell(f).status for f in features] == [CellStatus.TIMEOUT, CellStatus.FAIL, CellStatus.FAIL]
    # Killed before it wrote metrics: the bench catalog says the NCCL sweep spans the target's GPUs.
    killed = record(CU128, "allreduce-bandwidth", "timeout", tier="bench", probe="bench.allreduce.nccl-ring",
                    reason="killed at its 3600 s timeout")
    row = build_matrix([killed], plan, TARGET, features=features[:1], hosts=uvm).row(CU128)
    assert row.cell("allreduce-bandwidth").status is CellStatus.UNDECIDED
    fine = {RUN: {"check": {"status": "warn", "reason": "persistence mode off"}}, "other-run": wedged[RUN]}
    row = build_matrix(records, plan, TARGET, features=features, hosts=fine).row(CU128)
    assert all(row.cell(f).status is not CellStatus.UNDECIDED for f in features)


def test_the_readers_take_what_they_can_and_no_more():
    assert p2p_fault_pairs({"fault_pairs": [[1, 0]], "unreached_pairs": [[2, 3]]}) == {(0, 1), (2, 3)}
    # A record of the probe before the topology was read: every refused pair and broken copy is a fault.
    assert p2p_fault_pairs({"matrix": [[True, False], [False, True]], "copies": {}}) == {(0, 1)}
    assert p2p_fault_pairs({"copies": {"0->1": "ok 20 GB/s", "1->2": "hang: no progress"}}) == {(1, 2)}
    assert p2p_fault_pairs({}) is None and p2p_fault_pairs({"fault_pairs": "garbled"}) is None
    assert names_p2p("cudaIpcGetMemHandle failed") == "cudaIpcGetMemHandle"
    assert names_p2p("peer access is not supported between these two devices") == "peer access"
    assert names_p2p("NCCL refused Tree") is None and names_p2p("custom AR disabled: no P2P") == "P2P"
    checks = host_check_faults({"a": {"check": {"status": "fail", "gpus": "x"}}, "b": {"check": "odd"}, "c": [],
                                "d": {"check": {"status": "fail", "p2p": True, "p2p_pairs": [["x", 1]]}}})
    assert set(checks) == {"a", "d"} and not checks["a"].p2p and checks["d"].p2p and checks["d"].pairs is None


def test_only_features_of_the_catalog_that_rest_on_p2p_are_judged_by_pairs():
    catalog = load_feature_catalog()
    assert "p2p-access" in catalog.spec("nccl-graph-tree").rests_on
    assert catalog.spec("flashinfer-jit").rests_on == ()
