"""Stack locks resolved for real: uv against PyPI (through this machine's proxy) and the machine's
wheelhouse. A conflicting stack is refused in seconds in the resolver's words; the default matrix's
CUDA 13.1 stack resolves completely, every file with its sha256.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from _build_helpers import WHEELHOUSE, small_cell
from click.testing import CliRunner

from stackforge.build.locking import check_locks, resolve_lock
from stackforge.cli import cli
from stackforge.compose.dockerfile import ComposeOptions, lock_request
from stackforge.compose.stack_lock import LockRequest
from stackforge.core.errors import HostError
from stackforge.edges.resolver import ResolverIndexes
from stackforge.plan.planner import plan_file

CONFLICT_MATRIX = """\
schema: 1
name: conflict
targets: [rtx-pro-6000-x8-pcie]
defaults: {python: "3.11", flavour: wheels, os: debian12}
axes:
  cuda: ["13.1"]
  torch: ["2.14.1"]
  flashinfer: ["0.7.2"]
  sglang: ["0.5.23"]
  kernel: ["0.4.9"]
"""


@pytest.mark.pypi
def test_a_stack_whose_pins_conflict_is_refused_by_preflight_in_the_resolvers_words(tmp_path):
    matrix = tmp_path / "conflict.yaml"
    matrix.write_text(CONFLICT_MATRIX)
    started = time.monotonic()
    result = CliRunner().invoke(cli, ["plan", "--matrix", str(matrix), "--preflight"])
    took = time.monotonic() - started
    assert result.exit_code == 2, result.output
    refused = [line for line in result.output.splitlines() if line.strip().startswith("refused")]
    assert len(refused) == 1
    # The rules keep this stack (no rule knows the kernel pin); the resolver knows better, and says why.
    assert "sglang>=0.5.23 depends on sglang-kernel==0.4.10" in refused[0]
    assert "you require sglang-kernel==0.4.9" in refused[0]
    print(f"\nrefused in {took:.1f} s")


@pytest.mark.pypi
def test_the_default_cuda_13_1_stack_resolves_completely_with_every_hash():
    plan = plan_file(Path("matrices/default.yaml").resolve(), cuda=("13.1",))
    cells = [(stack, plan.cells_for(stack)[0].derived) for stack in plan.kept_stacks()]
    checks = check_locks(cells, compose=ComposeOptions(), indexes=ResolverIndexes())
    assert len(checks) == 1 and checks[0].lock is not None, checks[0].line()
    lock = checks[0].lock
    versions = lock.versions()
    assert (versions["torch"], versions["flashinfer-python"], versions["sglang"], versions["sglang-kernel"]) == \
        ("2.14.1", "0.7.2", "0.5.23", "0.4.10")
    assert not lock.unhashed
    assert {p.name for p in lock.layer("torch")} >= {"torch", "triton"}
    assert [p.name for p in lock.layer("sglang")] == ["sglang"]
    assert len(lock.layer("toolkit")) == 5 and len(lock.packages) > 150
    print(f"\n{checks[0].line()}")


@pytest.mark.pypi
def test_the_small_stack_takes_torch_from_the_wheelhouse():
    if not Path(WHEELHOUSE).is_dir():
        pytest.skip(f"needs the wheelhouse {WHEELHOUSE}")
    stack, derived = small_cell()
    request = lock_request(stack, derived, ComposeOptions(wheelhouse=True, no_deps=frozenset({"sglang"})),
                           glibc="2.36", find_links=(WHEELHOUSE,))
    lock = resolve_lock(request, ResolverIndexes(find_links=(WHEELHOUSE,)))
    torch = next(p for p in lock.packages if p.name == "torch")
    assert torch.version == "2.13.0+cpu" and torch.layer == "torch"
    assert any(f.location.startswith(f"file://{WHEELHOUSE}/") for f in torch.files)
    assert [p.pin() for p in lock.layer("sglang")] == ["sglang==0.5.9"]   # --no-deps: locked alone


def test_an_index_the_host_cannot_reach_is_exit_3_naming_it():
    request = LockRequest(stack_id="s", python="3.11", platform="x86_64-manylinux_2_36",
                          layers=(("torch", ("torch==2.9.1+cu130",)),), torch_index_url="http://127.0.0.1:9/whl/cu130")
    with pytest.raises(HostError) as raised:
        resolve_lock(request, ResolverIndexes())
    assert raised.value.exit_code == 3 and "http://127.0.0.1:9/whl/cu130" in raised.value.message


@pytest.mark.pypi
def test_render_locks_each_stack_as_build_does_and_keeps_the_lock_inside_its_out_folder(tmp_path):
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["render", "--cuda", "13.1", "--ca-bundle", "none", "--out", str(out / "contexts")])
    assert result.exit_code == 0, result.output
    [stack_id] = [line.split()[0].rsplit("/", 1)[-1] for line in result.stdout.splitlines() if line.strip()]
    lock = out / "contexts" / "locks" / stack_id / "pylock.toml"
    assert lock.is_file() and "lock resolved" in result.stderr
    assert sorted(p.name for p in out.iterdir()) == ["contexts"]   # nothing written outside --out
    context = out / "contexts" / stack_id
    assert (context / "lock" / "torch.txt").is_file() and (context / "lock" / "deps.txt").is_file()
    assert "--no-deps --require-hashes" in (context / "Dockerfile").read_text()
    again = CliRunner().invoke(cli, ["render", "--cuda", "13.1", "--ca-bundle", "none", "--out", str(out / "contexts")])
    assert "lock recorded" in again.stderr and again.stdout == result.stdout   # the same lock, the same tag


@pytest.mark.pypi
@pytest.mark.docker
def test_build_refuses_a_conflicting_stack_before_any_image_work(tmp_path):
    matrix = tmp_path / "conflict.yaml"
    matrix.write_text(CONFLICT_MATRIX)
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["build", "--matrix", str(matrix), "--out", str(out), "--no-progress",
                                      "--ca-bundle", "none"])
    assert result.exit_code == 2, result.output
    [error] = [line for line in result.stderr.splitlines() if line.startswith("stackforge: error:")]
    assert "stack cu131-torch2.14.1-fi0.7.2-sgl0.5.23-py311-wheels-debian12-k0.4.9:" in error
    assert "sglang>=0.5.23 depends on sglang-kernel==0.4.10" in error
    assert not (out / "builds").exists() and not (out / "contexts").exists() and not (out / "locks").exists()
