"""Runtime probe ``ep-a2a``: the MoE expert-parallel dispatch / combine all-to-all on N GPUs.

Each rank (own process, phase timeouts in the parent, as in ``nccl_graph.py``) holds T tokens of
hidden size H (bf16 on NCCL, float32 on gloo) and routes each to its top-k of E experts, the
experts spread evenly over the ranks; the routing is drawn from a generator seeded per source rank,
so every rank can recompute what every other rank sends it. Phases per rank:

* ``dispatch``: the (token, slot) rows sorted by expert (so grouped by destination rank), the
  per-destination counts exchanged with ``all_to_all_single`` on an int64 tensor, then the payload
  with uneven input/output split sizes. Every payload value encodes its source rank, token index
  and top-k slot (integers exact in bf16), so the receiver checks each row it got, and the counts,
  exactly against what the sources' routing says it must get.
* ``combine``: the received rows sent back (the identity "expert") with the splits reversed; the
  sender checks every row came back unchanged.
* ``graph_capture`` / ``graph_replay`` (NCCL only): dispatch + combine payload with the split sizes
  fixed, warmed up on a side stream, captured in a CUDA graph, replayed and checked again.
* DeepEP (NCCL only, where the image has ``deep_ep``): ``Buffer(group, num_nvl_bytes, 0)`` and one
  intranode dispatch / combine round as DeepEP's own tests/legacy/test_intranode.py does it.

Which result decides (``--decide-by``): ``sglang`` (feature ``ep-a2a``, SGLang's
``--moe-a2a-backend``) is decided by the backend SGLang would run, DeepEP where the image has it:
its round passing or failing in its own words; without DeepEP the image has no all-to-all backend
for SGLang (its default ``none`` runs none: sglang 0.5.9 wheel, sglang/srt/server_args.py
``moe_a2a_backend ... = "none"``), a skip with that reason. The torch ``all_to_all_single``
result stays in the metrics. ``torch`` (feature ``torch-a2a``) is decided by torch's all-to-all
alone, DeepEP not run.

``--backend gloo`` runs the same harness on CPU (gloo's ``all_to_all_single`` takes uneven split
sizes, checked on torch 2.13.0+cpu) and skips the CUDA-graph and DeepEP phases: it tests the probe,
not NCCL, and says so. Latencies are medians (``sf.median_us``), reported as the slowest rank's.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib.util
import inspect
import os
import sys
from collections.abc import Sequence
from typing import Any

import _sfprobe as sf

# Payload encoding: column 0 the source rank, 1 and 2 the token index in base 256, 3 the top-k
# slot, the rest a pattern of all four. Every value is an integer in [-125, 255]: bf16 holds every
# integer up to 256 exactly, so an exchanged row either equals its expectation or was damaged.
HEADER_COLUMNS = 4
TOKEN_BASE = 256
MAX_TOKENS = TOKEN_BASE * TOKEN_BASE
MAX_RANKS = 256
SENTINEL = -1.0  # what the graph-replay buffers hold before a replay; column 0 is never negative

DEEPEP_PHASE_PREFIX = "deepep"
DECIDERS = ("sglang", "torch")
DEEPEP_DISTRIBUTIONS = ("deep-ep", "sgl-deep-ep", "sgl-deep-ep-v25")


@dataclasses.dataclass(frozen=True, slots=True)
class Shape:
    """One serving-like MoE layer: tokens per rank, hidden size, experts per token, experts in all."""

    tokens: int
    hidden: int
    topk: int
    experts: int

    def problem(self, ranks: int) -> str:
        """Why this shape cannot be exchanged over ``ranks`` ranks, or ""."""
        if ranks > MAX_RANKS:
            return f"the payload encodes the source rank in one bf16 value: at most {MAX_RANKS} ranks"
        if self.experts % ranks:
            return f"{self.experts} experts do not spread evenly over {ranks} ranks"
        if not 1 <= self.topk <= self.experts:
            return f"top-{self.topk} of {self.experts} experts is not a routing"
        if not 1 <= self.tokens < MAX_TOKENS:
            return f"tokens must be between 1 and {MAX_TOKENS - 1}, got {self.tokens}"
        if self.hidden < HEADER_COLUMNS:
            return f"hidden must be at least {HEADER_COLUMNS} (the row header), got {self.hidden}"
        return ""


@dataclasses.dataclass(frozen=True, slots=True)
class Layout:
    """One source rank's dispatch order: its (token, slot) pairs sorted by expert, hence grouped by
    destination rank (experts are spread over the ranks in contiguous blocks)."""

    token: Any  # int64 [tokens * topk], CPU
    slot: Any
    dest: Any
    splits: tuple[int, ...]  # rows for each destination rank


# --------------------------------------------------------------------------------------------- routing

def routing(torch: Any, src: int, shape: Shape, seed: int) -> Any:
    """The experts [tokens, topk] source rank ``src`` routes its tokens to (CPU, deterministic)."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + src)
    scores = torch.rand((shape.tokens, shape.experts), generator=generator)
    return scores.topk(shape.topk, dim=1).indices


def layout(torch: Any, experts: Any, shape: Shape, ranks: int) -> Layout:
    flat = experts.reshape(-1)
    order = torch.argsort(flat, stable=True)
    dest = flat[order] // (shape.experts // ranks)
    splits = torch.bincount(dest, minlength=ranks).tolist()
    return Layout(order // shape.topk, order % shape.topk, dest, tuple(int(n) for n in splits))


def encode_rows(torch: Any, src: int, token: Any, slot: Any, hidden: int, dtype: Any, device: Any) -> Any:
    """The payload rows [n, hidden] for these (token, slot) pairs of source rank ``src``."""
    token = token.to(device).unsqueeze(1)
    slot = slot.to(device).unsqueeze(1)
    columns = torch.arange(hidden, device=device).unsqueeze(0)
    rows = (src * 131 + token * 31 + slot * 17 + columns * 7) % 251 - 125
    rows[:, 0] = src
    rows[:, 1] = token[:, 0] // TOKEN_BASE
    rows[:, 2] = token[:, 0] % TOKEN_BASE
    rows[:, 3] = slot[:, 0]
    return rows.to(dtype)


def describe_row(row: Any) -> str:
    values = [int(v) for v in row[:HEADER_COLUMNS].float().tolist()]
    return f"(src {values[0]}, token {values[1] * TOKEN_BASE + values[2]}, slot {values[3]})"


def check_rows(received: Any, expected: Any, where: str) -> int:
    """Raise AssertionError unless ``received`` equals ``expected`` row for row, exactly; the
    message names the first damaged row by what it should have been. Returns the rows checked."""
    if tuple(received.shape) != tuple(expected.shape):
        raise AssertionError(f"{where}: received {tuple(received.shape)}, expected {tuple(expected.shape)}")
    wrong = (received != expected).any(dim=1)
    count = int(wrong.sum().item())
    if count:
        row = int(wrong.nonzero()[0].item())
        column = int((received[row] != expected[row]).nonzero()[0].item())
        raise AssertionError(
            f"{where}: {count} of {expected.shape[0]} rows differ; first row {row}: expected "
            f"{describe_row(expected[row])}, got {describe_row(received[row])}, column {column}: "
            f"{float(received[row, column])} instead of {float(expected[row, column])}")
    return int(expected.shape[0])


def check_counts(received: Sequence[int], expected: Sequence[int], where: str) -> None:
    if list(received) != list(expected):
        raise AssertionError(f"{where}: {list(received)}, expected {list(expected)}")


def expected_inbox(torch: Any, rank: int, layouts: Sequence[Layout], shape: Shape, dtype: Any,
                   device: Any) -> tuple[Any, list[int]]:
    """What ``rank`` must receive: every source's rows for it in that source's order, and the counts."""
    blocks, counts = [], []
    for src, plan in enumerate(layouts):
        mine = plan.dest == rank
        blocks.append(encode_rows(torch, src, plan.token[mine], plan.slot[mine], shape.hidden, dtype, device))
        counts.append(int(mine.sum()))
    return torch.cat(blocks), counts


# --------------------------------------------------------------------------------------------- exchange

def exchange_counts(torch: Any, dist: Any, splits: Sequence[int], device: Any) -> list[int]:
    send = torch.tensor(list(splits), dtype=torch.int64, device=device)
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send)
    return [int(n) for n in recv.tolist()]


def dispatch(torch: Any, dist: Any, rows: Any, splits: Sequence[int], device: Any) -> tuple[Any, list[int]]:
    """Counts first (the receiver sizes its buffer from them), then the rows, uneven splits."""
    recv_splits = exchange_counts(torch, dist, splits, device)
    received = rows.new_empty((sum(recv_splits), rows.shape[1]))
    dist.all_to_all_single(received, rows, recv_splits, list(splits))
    return received, recv_splits


def combine(dist: Any, expert_out: Any, recv_splits: Sequence[int], splits: Sequence[int]) -> Any:
    """The reverse exchange: each row goes back to the rank it came from."""
    back = expert_out.new_empty((sum(splits), expert_out.shape[1]))
    dist.all_to_all_single(back, expert_out, list(splits), list(recv_splits))
    return back


def corrupt(rows: Any) -> None:
    """Damage one value (``--corrupt-rank``): proves the checks can fail."""
    if rows.shape[0] == 0:
        raise RuntimeError("--corrupt-rank: this rank has no rows to damage")
    rows[0, -1] += 1


# --------------------------------------------------------------------------------------------- ranks

def worker(rank: int, world_size: int, options: dict[str, Any], reporter: sf.RankReporter) -> None:
    """One rank: init, dispatch, combine, CUDA graph and DeepEP (NCCL only), destroy."""
    import torch
    import torch.distributed as dist

    nccl = options["backend"] == "nccl"
    shape = Shape(**options["shape"])
    with reporter.phase("init") as data:
        device = init_rank(torch, dist, rank, world_size, options)
        if nccl:
            data["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
            data["gpu"] = torch.cuda.get_device_name(device)
    sync = torch.cuda.synchronize if nccl else (lambda: None)
    dtype = torch.bfloat16 if nccl else torch.float32
    with reporter.phase("prepare") as data:  # every rank's routing: what this rank sends and must receive
        layouts = [layout(torch, routing(torch, src, shape, options["seed"]), shape, world_size)
                   for src in range(world_size)]
        mine = layouts[rank]
        rows = encode_rows(torch, rank, mine.token, mine.slot, shape.hidden, dtype, device)
        expected, expected_counts = expected_inbox(torch, rank, layouts, shape, dtype, device)
        data["splits"] = list(mine.splits)
    damage = options["corrupt_rank"] == rank
    with reporter.phase("dispatch") as data:
        received, recv_splits = dispatch(torch, dist, rows, mine.splits, device)
        sync()
        if damage and options["corrupt_phase"] == "dispatch":
            corrupt(received)
        check_counts(recv_splits, expected_counts, "dispatch counts (rows per source rank)")
        data["rows"] = check_rows(received, expected, "dispatch")
        data["send_bytes"] = rows.numel() * rows.element_size()
        data["recv_bytes"] = received.numel() * received.element_size()
        data["remote_send_bytes"] = (sum(mine.splits) - mine.splits[rank]) * shape.hidden * rows.element_size()
        data["dispatch_us"] = sf.median_us(lambda: dispatch(torch, dist, rows, mine.splits, device), sync,
                                           options["iters"])
    with reporter.phase("combine") as data:
        back = combine(dist, received, recv_splits, mine.splits)
        sync()
        if damage and options["corrupt_phase"] == "combine":
            corrupt(back)
        data["rows"] = check_rows(back, rows, "combine")
        data["combine_us"] = sf.median_us(lambda: combine(dist, received, recv_splits, mine.splits), sync,
                                          options["iters"])
    if nccl:
        run_graph_phases(torch, dist, rows, expected, mine.splits, recv_splits, options, reporter)
    else:
        reporter.send("graph_capture", "skip", "gloo has no CUDA graphs")
    group_usable = True
    if nccl and options["deepep"]:
        group_usable = run_deepep(torch, dist, rank, world_size, shape, options, reporter, device)
    if group_usable:  # after a broken DeepEP exchange the group may be wedged: leave it to the exit
        with reporter.phase("destroy"):
            dist.destroy_process_group()


def init_rank(torch: Any, dist: Any, rank: int, world_size: int, options: dict[str, Any]) -> Any:
    if options["backend"] == "nccl":
        return sf.init_nccl_rank(torch, dist, rank, world_size, options)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{options['port']}", rank=rank,
                            world_size=world_size,
                            timeout=datetime.timedelta(seconds=options["collective_timeout_s"]))
    return torch.device("cpu")


def run_graph_phases(torch: Any, dist: Any, rows: Any, expected: Any, splits: Sequence[int],
                     recv_splits: Sequence[int], options: dict[str, Any], reporter: sf.RankReporter) -> None:
    """Dispatch + combine payload with split sizes fixed at capture (a graph cannot read counts)."""
    received = torch.empty_like(expected)
    back = torch.empty_like(rows)

    def exchange() -> None:
        dist.all_to_all_single(received, rows, list(recv_splits), list(splits))
        dist.all_to_all_single(back, received, list(splits), list(recv_splits))

    with reporter.phase("graph_capture"):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):  # NCCL must have run on the capture stream before capture
                exchange()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            exchange()
        torch.cuda.synchronize()
    with reporter.phase("graph_replay") as data:
        received.fill_(SENTINEL)
        back.fill_(SENTINEL)
        graph.replay()
        torch.cuda.synchronize()
        check_rows(received, expected, "graph replay dispatch")
        data["rows"] = check_rows(back, rows, "graph replay combine")
        data["graph_us"] = sf.median_us(graph.replay, torch.cuda.synchronize, options["iters"])


# --------------------------------------------------------------------------------------------- DeepEP
# API checked against deepseek-ai/DeepEP at dd758caf451848bd150e1046af3d0a73e5fff38d
# (deep_ep/buffers/legacy.py, tests/legacy/test_intranode.py), at v1.2.1 9af0e0d0e74f3577af1979c9b9e1ac2cad0104ee
# (deep_ep/buffer.py, tests/test_intranode.py) and in the PyPI wheel sgl-deep-ep 0.1.2.post1
# (deep_ep/buffers/legacy.py): Buffer(group, num_nvl_bytes, num_rdma_bytes, ..., explicitly_destroy),
# get_dispatch_layout(topk_idx, num_experts) -> (per rank, per RDMA rank, per expert, is_token_in_rank,
# event), dispatch(x, num_tokens_per_rank=, is_token_in_rank=, num_tokens_per_expert=, topk_idx=,
# topk_weights=) -> (recv_x, recv_topk_idx, recv_topk_weights, recv_tokens_per_expert, handle, event)
# with handle[0] the rank prefix matrix, combine(x, handle) -> (combined_x, topk_weights, event),
# the combine being a sum (no weights) over the ranks a token went to.

def run_deepep(torch: Any, dist: Any, rank: int, world_size: int, shape: Shape, options: dict[str, Any],
               reporter: sf.RankReporter, device: Any) -> bool:
    """DeepEP's Buffer and one intranode round; True when the process group is still usable."""
    buffer = None
    with reporter.attempt("deepep_buffer") as data:
        import deep_ep

        data["version"] = str(getattr(deep_ep, "__version__", ""))
        data["num_nvl_bytes"] = options["deepep_nvl_bytes"]
        buffer = make_deepep_buffer(deep_ep, dist.group.WORLD, options["deepep_nvl_bytes"])
    everyone: list[bool] = []
    with reporter.attempt("deepep_agree") as data:  # a rank without a buffer must not strand its peers
        flag = torch.tensor([int(buffer is not None)], dtype=torch.int32, device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        everyone.append(bool(flag.item()))
        data["all_built"] = everyone[0]
    if not everyone:
        return False
    if not everyone[0]:
        reporter.send("deepep_round", "skip", "a rank could not construct the DeepEP Buffer")
        return True
    exchanged: list[bool] = []
    with reporter.attempt("deepep_round") as data:
        data.update(deepep_round(torch, deep_ep, buffer, rank, world_size, shape, options, device, exchanged))
    if not exchanged:
        return False
    if getattr(buffer, "explicitly_destroy", False):
        with reporter.attempt("deepep_destroy"):
            buffer.destroy()
    return True


def make_deepep_buffer(deep_ep: Any, group: Any, num_nvl_bytes: int) -> Any:
    """Intranode buffer, no RDMA bytes; destroyed explicitly where DeepEP allows it (its docstring:
    releasing in the destructor may hang Python's exception handling)."""
    parameters = inspect.signature(deep_ep.Buffer.__init__).parameters
    extra = {"explicitly_destroy": True} if "explicitly_destroy" in parameters else {}
    return deep_ep.Buffer(group, num_nvl_bytes, 0, **extra)


def deepep_round(torch: Any, deep_ep: Any, buffer: Any, rank: int, world_size: int, shape: Shape,
                 options: dict[str, Any], device: Any, exchanged: list[bool]) -> dict[str, Any]:
    """Layout, dispatch and combine of this rank's tokens (slot 0 rows: DeepEP sends a token once per
    destination rank); checked only after both exchanges so a failed check cannot strand a peer."""
    experts = routing(torch, rank, shape, options["seed"])
    topk_idx = experts.to(device).to(getattr(deep_ep, "topk_idx_t", torch.int64))
    tokens = torch.arange(shape.tokens)
    x = encode_rows(torch, rank, tokens, torch.zeros_like(tokens), shape.hidden, torch.bfloat16, device)
    weights = torch.ones((shape.tokens, shape.topk), dtype=torch.float32, device=device)

    def one_round() -> tuple[Any, ...]:
        per_rank, _, per_expert, in_rank, _ = buffer.get_dispatch_layout(topk_idx, shape.experts)
        recv_x, _, _, recv_per_expert, handle, _ = buffer.dispatch(
            x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert,
            topk_idx=topk_idx, topk_weights=weights)
        combined, _, _ = buffer.combine(recv_x, handle)
        return recv_x, list(recv_per_expert), handle[0], combined, in_rank

    recv_x, recv_per_expert, prefix, combined, in_rank = one_round()
    torch.cuda.synchronize()
    round_us = sf.median_us(one_round, torch.cuda.synchronize, options["iters"])
    exchanged.append(True)
    check_deepep_dispatch(torch, recv_x, recv_per_expert, prefix, rank, world_size, shape, options["seed"])
    copies = in_rank.sum(dim=1, keepdim=True).float()
    diff = calc_diff(combined.float() / copies, x.float())
    check_rows(combined, deepep_combine_expected(torch, x, copies), "DeepEP combine (sum of a token's copies)")
    return {"recv_tokens": int(recv_x.shape[0]), "combine_diff": diff, "round_us": round_us}


def deepep_combine_expected(torch: Any, x: Any, copies: Any) -> Any:
    """DeepEP's intranode combine adds a token's copies in fp32 and rounds once to bf16
    (csrc/kernels/legacy/intranode.cu, combine: ``values[k] += static_cast<float>(...)`` then
    ``static_cast<dtype_t>(values[j])``, at dd758caf). The payload is integers of at most 255 and a
    token has at most one copy per rank, so the fp32 sum is exact whatever the order, and the one
    rounding is torch's round-to-nearest-even: the expectation is exact, not a tolerance."""
    return (x.float() * copies).to(torch.bfloat16)


def check_deepep_dispatch(torch: Any, recv_x: Any, recv_per_expert: Sequence[int], prefix: Any, rank: int,
                          world_size: int, shape: Shape, seed: int) -> None:
    """Every source's block (rows prefix[src-1][rank]..prefix[src][rank]) holds exactly the tokens
    it routes to this rank, each intact; the per-local-expert counts match the routing."""
    per_rank = shape.experts // world_size
    local = range(rank * per_rank, (rank + 1) * per_rank)
    expected_per_expert = [0] * per_rank
    start = 0
    for src in range(world_size):
        experts = routing(torch, src, shape, seed)
        for i, expert in enumerate(local):
            expected_per_expert[i] += int((experts == expert).sum())
        tokens = ((experts // per_rank) == rank).any(dim=1).nonzero().flatten()
        end = int(prefix[src][rank])
        block = recv_x[start:end]
        got = (block[:, 1].float() * TOKEN_BASE + block[:, 2].float()).long()
        ordered = block[torch.argsort(got)] if block.shape[0] else block  # DeepEP keeps no promise on order
        check_rows(ordered, encode_rows(torch, src, tokens, torch.zeros_like(tokens), shape.hidden,
                                        torch.bfloat16, recv_x.device), f"DeepEP dispatch from rank {src}")
        start = end
    if start != recv_x.shape[0]:
        raise AssertionError(f"DeepEP dispatch: {recv_x.shape[0]} rows received, the prefix matrix accounts "
                             f"for {start}")
    check_counts(recv_per_expert, expected_per_expert, "DeepEP tokens per local expert")


def calc_diff(x: Any, y: Any) -> float:
    """DeepEP's similarity measure (deep_ep/utils/math.py calc_diff at dd758caf; its test_intranode
    wants calc_diff(combined / copies, x) < 5e-6), reported next to the exact check."""
    x, y = x.double() + 1, y.double() + 1
    denominator = (x * x + y * y).sum()
    return float((1 - 2 * (x * y).sum() / denominator).item())


def deepep_installed() -> tuple[str, str]:
    """(the installed DeepEP version or "" if only the module is there, a note) or ("", "") if absent.

    SGLang images install DeepEP from source (distribution ``deep-ep``, module ``deep_ep``) or as
    the ``sgl-deep-ep`` wheel (same module); the module is located without importing it, because
    importing DeepEP initialises CUDA and NCCL, which the parent must not do before spawning ranks."""
    for name in DEEPEP_DISTRIBUTIONS:
        version = sf.installed_version(name)
        if version:
            return version, f"distribution {name}"
    if importlib.util.find_spec("deep_ep") is not None:
        return "", "module deep_ep (no distribution metadata)"
    return "", ""


# --------------------------------------------------------------------------------------------- parent

def main(argv: Sequence[str]) -> None:
    parser = sf.common_parser(__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
    parser.add_argument("--phase-timeout", type=float, default=120.0, help="seconds a phase may make no progress")
    # DeepSeek-V3's MoE layer (hidden 7168, 256 routed experts, 8 per token), also DeepEP's test defaults.
    parser.add_argument("--tokens", type=int, default=1024, help="tokens per rank")
    parser.add_argument("--hidden", type=int, default=7168)
    parser.add_argument("--topk", type=int, default=8)
    parser.add_argument("--experts", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--no-deepep", dest="deepep", action="store_false", help="skip DeepEP even if installed")
    parser.add_argument("--decide-by", choices=DECIDERS, default="sglang",
                        help="sglang: the all-to-all backend SGLang would use (DeepEP); torch: all_to_all_single")
    parser.add_argument("--deepep-nvl-bytes", type=int, default=int(2e9),
                        help="DeepEP Buffer num_nvl_bytes (DeepEP's test_intranode uses 2e9)")
    # Debug: damage one received value on this rank, so the checks are seen to fail.
    parser.add_argument("--corrupt-rank", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--corrupt-phase", choices=("dispatch", "combine"), default="dispatch",
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    shape = Shape(args.tokens, args.hidden, args.topk, args.experts)
    deepep_version, deepep_source = deepep_installed()
    by_sglang = args.decide_by == "sglang" and args.backend == "nccl"
    if by_sglang and not (args.deepep and deepep_source):
        # ep-a2a is DeepEP's verdict: without it nothing here can decide it, and torch's all_to_all (whose
        # hang or crash would otherwise be filed under ep-a2a) is torch-a2a's probe.
        sf.emit("skip", deepep_absent_reason(args.deepep, deepep_source), facts=sf.collect_facts(import_torch=False))
    status, reason, torch = sf.multi_gpu_preflight(args.backend, args.gpus, args.arch)
    facts = sf.collect_facts(torch_module=torch, import_torch=False)
    if deepep_source:
        facts["deep_ep"] = {"version": deepep_version, "found_as": deepep_source}
    if status:
        sf.emit(status, reason, facts=facts)
    problem = shape.problem(args.gpus)
    if problem:
        sf.emit("skip", f"{args.gpus} ranks, {shape}: {problem}", facts=facts)
    options = {"backend": args.backend, "port": sf.free_tcp_port(), "shape": dataclasses.asdict(shape),
               "seed": args.seed, "iters": args.iters, "corrupt_rank": args.corrupt_rank,
               "corrupt_phase": args.corrupt_phase, "deepep": args.deepep and bool(deepep_source),
               "deepep_nvl_bytes": args.deepep_nvl_bytes,
               # torch's own collective timeout sits above ours so that the parent names the hung phase
               "collective_timeout_s": args.phase_timeout * 3}
    env = {} if "NCCL_DEBUG" in os.environ else {"NCCL_DEBUG": "WARN"}
    outcome = sf.run_ranks(worker, args.gpus, options, phase_timeout_s=args.phase_timeout, env=env)
    dtype = "bf16" if args.backend == "nccl" else "float32"
    what = (f"{args.backend} all_to_all_single EP dispatch/combine, {args.gpus} ranks x {shape.tokens} tokens x "
            f"{shape.hidden} {dtype}, top-{shape.topk} of {shape.experts} experts")
    core, deepep_stuck = split_deepep(outcome)
    metrics = {**summarize(core, args.backend, args.gpus, shape),
               **deepep_metrics(outcome, args.backend, args.deepep, deepep_source, deepep_stuck)}
    failed = sf.ranks_result(core, what)
    if failed is not None:
        sf.emit_result(torch_failed_first(failed) if by_sglang else failed, facts, metrics)
    result = decide(args.backend, args.gpus, what, metrics, outcome)
    if args.decide_by == "sglang" and args.backend == "nccl":
        result = sglang_backend_result(result, metrics, args.gpus)
    sf.emit_result(result, facts, metrics)


def deepep_absent_reason(wanted: bool, source: str) -> str:
    """Why ``ep-a2a`` is a skip before anything runs: no DeepEP in the image, or --no-deepep."""
    if not wanted:
        return "DeepEP not run (--no-deepep): ep-a2a is DeepEP's verdict; torch's all_to_all is torch-a2a's probe"
    return ("DeepEP not in this image (no deep_ep module and no " + "/".join(DEEPEP_DISTRIBUTIONS) + " distribution): "
            "SGLang's --moe-a2a-backend deepep cannot run here; torch's all_to_all is torch-a2a's probe")


def torch_failed_first(failed: sf.ScriptResult) -> sf.ScriptResult:
    """``ep-a2a`` when torch's all_to_all phases failed before DeepEP's round ran: undecided, never a fail
    of DeepEP; the failure itself is torch-a2a's verdict."""
    return sf.ScriptResult("undecided", f"DeepEP's round was not reached: torch's all_to_all_single failed first "
                           f"({failed.status}: {failed.reason[:400]}); that is torch-a2a's verdict", failed.evidence)


def split_deepep(outcome: sf.RanksOutcome) -> tuple[sf.RanksOutcome, str]:
    """(the outcome the all-to-all is judged on, how DeepEP hung or crashed or ""): a DeepEP hang or
    crash comes after every torch phase and is DeepEP's result, not the all-to-all's."""
    if outcome.hung is not None and outcome.hung[1].startswith(DEEPEP_PHASE_PREFIX):
        rank, phase, seconds = outcome.hung
        return (dataclasses.replace(outcome, hung=None),
                f"hang: rank {rank} made no progress in phase '{phase}' for {seconds:.0f} s; all ranks were killed")
    crashed = outcome.crashed()
    if crashed:
        rank, code = crashed[0]
        phases = [e.phase for e in outcome.events if e.rank == rank]
        if phases and phases[-1].startswith(DEEPEP_PHASE_PREFIX):
            rest = tuple(r for r in outcome.closed_first if r != rank)
            return (dataclasses.replace(outcome, closed_first=rest),
                    f"crash: rank {rank} died ({sf.rank_signal_name(code)}) in phase '{phases[-1]}'")
    return outcome, ""


def summarize(outcome: sf.RanksOutcome, backend: str, gpus: int, shape: Shape) -> dict[str, Any]:
    metrics: dict[str, Any] = {"backend": backend, "ranks": gpus, **dataclasses.asdict(shape)}
    for key, phase in (("dispatch_us", "dispatch"), ("combine_us", "combine"), ("graph_us", "graph_replay")):
        values = [e.data[key] for e in outcome.phase_events(phase) if key in e.data]
        if values:
            metrics[f"{key}_max_rank"] = max(values)
    dispatched = outcome.phase_events("dispatch")
    for key in ("send_bytes", "recv_bytes", "remote_send_bytes"):
        values = [e.data[key] for e in dispatched if key in e.data]
        if values:
            metrics[f"dispatch_{key}_max_rank"] = max(values)
    if dispatched:  # combine moves the same rows back: each rank sends what it received
        metrics["bytes_moved_max_rank"] = max(e.data.get("send_bytes", 0) + e.data.get("recv_bytes", 0)
                                              for e in dispatched)
    for phase in ("dispatch", "combine", "graph_replay"):
        rows = [e.data["rows"] for e in outcome.phase_events(phase) if "rows" in e.data]
        if rows:
            metrics[f"{phase}_rows_verified"] = sum(rows)
    metrics.update(outcome.nccl_facts())
    return metrics


def deepep_metrics(outcome: sf.RanksOutcome, backend: str, wanted: bool, source: str, stuck: str) -> dict[str, Any]:
    """DeepEP's own outcome: ``deepep`` is pass, fail: <its words>, skip: <why> or absent."""
    if not source:
        return {"deepep": "absent: no deep_ep module and no " + "/".join(DEEPEP_DISTRIBUTIONS) + " distribution"}
    if backend != "nccl":
        return {"deepep": "skip: DeepEP runs on NCCL and GPUs, this is a gloo run"}
    if not wanted:
        return {"deepep": "skip: --no-deepep"}
    metrics: dict[str, Any] = {}
    versions = {e.data["version"] for e in outcome.phase_events("deepep_buffer") if e.data.get("version")}
    if versions:
        metrics["deepep_version"] = ", ".join(sorted(versions))
    rounds = outcome.phase_events("deepep_round")
    if rounds:
        metrics["deepep_round_us_max_rank"] = max(e.data.get("round_us", 0.0) for e in rounds)
        metrics["deepep_combine_diff_max_rank"] = max(e.data.get("combine_diff", 0.0) for e in rounds)
    broken = [e for e in outcome.events if e.phase.startswith(DEEPEP_PHASE_PREFIX) and e.state == "check-fail"]
    if broken:
        first = broken[0]
        metrics["deepep"] = f"fail: rank {first.rank} {first.phase}: {first.detail}"
    elif stuck:
        metrics["deepep"] = f"fail: {stuck}"
    elif len(rounds) == len(outcome.exitcodes):
        metrics["deepep"] = "pass"
    else:
        metrics["deepep"] = "fail: not every rank finished a DeepEP round"
    return metrics


def decide(backend: str, gpus: int, what: str, metrics: dict[str, Any], outcome: sf.RanksOutcome) -> sf.ScriptResult:
    log = outcome.log()
    needed = ("dispatch", "combine") + (("graph_replay",) if backend == "nccl" else ())
    missing = [p for p in needed if len(outcome.phase_events(p)) != gpus]
    if missing:
        return sf.ScriptResult("fail", f"{what}: not every rank completed {', '.join(missing)}", log)
    deepep = f"; DeepEP: {metrics['deepep'][:300]}"
    rows = f"{metrics['dispatch_rows_verified']} (token, expert) rows"
    if backend == "gloo":
        return sf.ScriptResult("pass", f"gloo harness: {gpus} ranks exchanged counts and {rows} with all_to_all_single "
                               "(uneven splits); every row was exact at its receiver and back at its sender; "
                               "CUDA-graph phases skipped (gloo has no CUDA graphs), so this says nothing about NCCL",
                               log)
    return sf.ScriptResult("pass", f"{what}: {rows} exact after dispatch ({metrics.get('dispatch_us_max_rank')} us) and "
                           f"combine ({metrics.get('combine_us_max_rank')} us) and replayed from a CUDA graph "
                           f"({metrics.get('graph_us_max_rank')} us), NCCL {metrics.get('nccl')}{deepep}", log)


def sglang_backend_result(torch_result: sf.ScriptResult, metrics: dict[str, Any], gpus: int) -> sf.ScriptResult:
    """``ep-a2a`` by the backend SGLang's ``--moe-a2a-backend`` would run: DeepEP's own result where
    the image has it, a skip where it has no all-to-all backend; torch's result stays a metric."""
    metrics["torch_all_to_all"] = f"{torch_result.status}: {torch_result.reason[:300]}"
    deepep = metrics.get("deepep", "")
    what = f"SGLang --moe-a2a-backend deepep on {gpus} GPUs"
    if deepep.startswith("absent"):
        return sf.ScriptResult("skip", f"no all-to-all backend SGLang could use in this image ({deepep}); SGLang's default "
                               "--moe-a2a-backend none runs no all-to-all (torch's all_to_all_single: "
                               f"{torch_result.status}, see torch-a2a)", torch_result.evidence)
    if deepep == "pass":
        return sf.ScriptResult("pass", f"{what}: DeepEP's intranode dispatch/combine round matched "
                               f"({metrics.get('deepep_round_us_max_rank')} us, DeepEP {metrics.get('deepep_version')}); "
                               f"torch all_to_all_single: {torch_result.status}", torch_result.evidence)
    if deepep.startswith("fail"):
        return sf.ScriptResult("fail", f"{what}: DeepEP {deepep[len('fail: '):]}; torch all_to_all_single: "
                               f"{torch_result.status}", torch_result.evidence)
    return sf.ScriptResult("skip", f"{what}: DeepEP not run ({deepep})", torch_result.evidence)


if __name__ == "__main__":
    sf.run_main(main, sys.argv[1:])
