"""Stack locks (PEP 751 pylock.toml): reading the resolver's answer, layers, the written lock and its
refusals, the Dockerfile that installs a lock, the lock modes of a build, and the resolver's errors.

The resolver's answers here are short hand-written PEP 751 texts in the shape uv writes them; the tests
that run uv against PyPI are in tests/test_stack_lock_pypi.py.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from _build_helpers import small_cell
from click.testing import CliRunner

from stackforge.build import locking
from stackforge.build.locking import LockMode, obtain_lock
from stackforge.build.verify import lock_check
from stackforge.cli import cli
from stackforge.compose.dockerfile import ComposeOptions, compose_stack, lock_request
from stackforge.compose.stack_lock import (
    StackLock,
    assign_layers,
    layer_requirements_text,
    lock_changes,
    packages_from_pylock,
    read_stack_lock,
)
from stackforge.core.errors import HostError, SpecError
from stackforge.core.records import Status
from stackforge.edges import resolver
from stackforge.edges.runner import CommandResult

SHA = {name: f"{i:x}" * 64 for i, name in enumerate(["torch", "filelock", "flashinfer", "numpy", "sglang", "nvcc",
                                                       "cccl", "crt", "runtime", "nvvm", "sdist"], start=1)}
SHA = {name: (value * 64)[:64] for name, value in SHA.items()}


def _entry(name: str, version: str, sha: str | None, *, sdist: bool = False) -> str:
    hashes = f'{{ sha256 = "{sha}" }}' if sha else "{}"
    files = (f'sdist = {{ url = "https://files.example/{name}-{version}.tar.gz", hashes = {hashes} }}' if sdist else
             f'wheels = [{{ url = "https://files.example/{name}-{version}-py3-none-any.whl", size = 10, '
             f'hashes = {hashes} }}]')
    return f'[[packages]]\nname = "{name}"\nversion = "{version}"\n{files}\n'


def _pylock(*entries: str) -> str:
    return 'lock-version = "1.0"\ncreated-by = "uv"\nrequires-python = ">=3.11"\n\n' + "\n".join(entries)


TORCH_ANSWER = _pylock(_entry("torch", "2.13.0+cpu", SHA["torch"]), _entry("filelock", "4.3.1", SHA["filelock"]))
FULL_ANSWER = _pylock(_entry("torch", "2.13.0+cpu", SHA["torch"]), _entry("filelock", "4.3.1", SHA["filelock"]),
                      _entry("flashinfer-python", "0.6.6", SHA["flashinfer"]), _entry("numpy", "2.4.6", SHA["numpy"]))
EXACT_ANSWER = _pylock(*(_entry(n, v, SHA[k]) for n, v, k in [
    ("nvidia-cuda-cccl", "13.0.85", "cccl"), ("nvidia-cuda-crt", "13.0.88", "crt"),
    ("nvidia-cuda-nvcc", "13.0.88", "nvcc"), ("nvidia-cuda-runtime", "13.0.96", "runtime"),
    ("nvidia-nvvm", "13.0.88", "nvvm"), ("sglang", "0.5.9", "sglang")]))


def _request():
    stack, derived = small_cell()
    options = ComposeOptions(wheelhouse=True, no_deps=frozenset({"sglang"}))
    return stack, derived, lock_request(stack, derived, options, glibc="2.36", find_links=("/opt/wheels",))


def _lock(request) -> StackLock:
    resolved = packages_from_pylock(FULL_ANSWER, source="answer")
    exact = packages_from_pylock(EXACT_ANSWER, source="answer")
    return StackLock(stack_id=request.stack_id, request_key=request.key(), python="3.11",
                     platform=request.platform, resolver="uv 0.13.9",
                     packages=assign_layers(request, resolved, {"torch", "filelock"}, exact))


# --------------------------------------------------------------------------- request and layers


def test_the_request_holds_what_the_image_installs_in_its_layers():
    _, _, request = _request()
    assert request.platform == "x86_64-manylinux_2_36"
    assert dict(request.layers) == {"torch": ("torch==2.13.0+cpu",), "flashinfer": ("flashinfer-python==0.6.6",)}
    exact = dict(request.exact)
    assert exact["sglang"] == ("sglang==0.5.9",)            # installed --no-deps: locked without dependencies
    assert "nvidia-cuda-nvcc==13.0.88" in exact["toolkit"]
    # Anything the resolution depends on changes the key; the same inputs give the same key.
    assert request.key() == _request()[2].key()
    assert dataclasses.replace(request, find_links=()).key() != request.key()


def test_torch_and_what_it_pulls_in_share_a_layer_and_each_named_package_has_its_own():
    _, _, request = _request()
    lock = _lock(request)
    layers = {layer: [p.name for p in lock.layer(layer)] for layer in ("torch", "deps", "flashinfer", "sglang")}
    assert layers == {"torch": ["torch", "filelock"], "deps": ["numpy"], "flashinfer": ["flashinfer-python"],
                      "sglang": ["sglang"]}
    assert len(lock.layer("toolkit")) == 5
    assert "nvidia-cuda-nvcc" not in {p.name for p in lock.venv_packages}   # the toolkit lives outside the venv


def test_a_package_in_the_venv_and_in_the_toolkit_prefix_is_locked_in_both_places():
    # torch brings nvidia-cuda-runtime 13.0.x into the venv; the toolkit prefix holds 13.0.96 of its own.
    _, _, request = _request()
    resolved = packages_from_pylock(_pylock(_entry("torch", "2.13.0+cpu", SHA["torch"]),
                                            _entry("nvidia-cuda-runtime", "13.0.48", SHA["filelock"]),
                                            _entry("flashinfer-python", "0.6.6", SHA["flashinfer"])), source="a")
    exact = packages_from_pylock(EXACT_ANSWER, source="a")
    lock = StackLock(stack_id=request.stack_id, request_key=request.key(), python="3.11", platform=request.platform,
                     resolver="uv", packages=assign_layers(request, resolved, {"torch", "nvidia-cuda-runtime"}, exact))
    back = read_stack_lock(lock.to_toml(), source="pylock.toml", request=request)
    assert sorted(p.pin() for p in back.layer("torch")) == ["nvidia-cuda-runtime==13.0.48", "torch==2.13.0+cpu"]
    assert "nvidia-cuda-runtime==13.0.96" in [p.pin() for p in back.layer("toolkit")]


def test_a_layer_file_pins_each_package_with_every_hash():
    _, _, request = _request()
    text = layer_requirements_text(_lock(request).layer("torch"))
    assert text == (f"filelock==4.3.1 \\\n    --hash=sha256:{SHA['filelock']}\n"
                    f"torch==2.13.0+cpu \\\n    --hash=sha256:{SHA['torch']}\n")


# --------------------------------------------------------------------------- the written lock


def test_the_written_lock_reads_back_the_same_and_is_standard_toml():
    import tomllib
    _, _, request = _request()
    lock = _lock(request)
    text = lock.to_toml()
    document = tomllib.loads(text)
    assert document["lock-version"] == "1.0" and document["created-by"] == "stackforge"
    # [[packages]] is exactly the venv; the toolkit's own prefix is listed under tool.stackforge.
    assert {p["name"] for p in document["packages"]} == {"torch", "filelock", "numpy", "flashinfer-python", "sglang"}
    assert len(document["tool"]["stackforge"]["toolkit"]) == 5
    back = read_stack_lock(text, source="pylock.toml", request=request)
    assert back.to_toml() == text and back.sha256() == lock.sha256()


@pytest.mark.parametrize("edit, words, line_of", [
    (lambda t: t.replace('version = "2.4.6"', 'version = "two"'), "not a PEP 440 version", 'name = "numpy"'),
    (lambda t: t.replace(SHA["numpy"], "abc"), "is not a sha256", 'name = "numpy"'),
    (lambda t: t.replace('layer = "deps"', 'layer = "attic"'), "unknown layer 'attic'", 'name = "numpy"'),
    (lambda t: t.replace('version = "0.6.6"', 'version = "0.6.7"'), "asks for flashinfer-python==0.6.6",
     'name = "flashinfer-python"'),
    (lambda t: t + '\n[[packages]]\nname = "numpy"\nversion = "2.4.6"\nwheels = [{ url = "https://x/n.whl", '
                   f'hashes = {{ sha256 = "{SHA["numpy"]}" }} }}]\ntool.stackforge.layer = "deps"\n',
     "locked twice", None),
    (lambda t: t.replace('[tool.stackforge]\n', '[tool.stackforge\n'), "not valid TOML", None),
])
def test_a_lock_edited_into_an_inconsistent_state_is_refused_with_the_line(edit, words, line_of):
    _, _, request = _request()
    text = edit(_lock(request).to_toml())
    with pytest.raises(SpecError) as raised:
        read_stack_lock(text, source="pylock.toml", request=request)
    assert words in raised.value.message
    assert raised.value.line is not None
    if line_of is not None:
        assert text.splitlines()[raised.value.line - 1] == line_of


def test_a_lock_made_for_other_inputs_is_stale():
    stack, derived, request = _request()
    other = lock_request(stack, derived, ComposeOptions(wheelhouse=True), glibc="2.36", find_links=("/opt/wheels",))
    with pytest.raises(SpecError, match="resolved for other inputs"):
        read_stack_lock(_lock(request).to_toml(), source="pylock.toml", request=other)


def test_lock_changes_name_what_moved():
    _, _, request = _request()
    old = _lock(request)
    moved = [dataclasses.replace(p, version="2.5.0") if p.name == "numpy" else p for p in old.packages
             if p.name != "filelock"]
    new = dataclasses.replace(old, packages=tuple(moved))
    assert lock_changes(old, new) == ["numpy 2.4.6 -> 2.5.0", "- filelock 4.3.1"]
    assert lock_changes(old, old) == []


# --------------------------------------------------------------------------- the Dockerfile of a lock


def test_every_layer_installs_its_part_of_the_lock_exactly():
    stack, derived, request = _request()
    lock = _lock(request)
    composed = compose_stack(stack, derived, ComposeOptions(wheelhouse=True, no_deps=frozenset({"sglang"}),
                                                            lock=lock))
    installs = [line for line in composed.dockerfile.splitlines() if " pip install --" in line]
    assert len(installs) == 5      # torch, toolkit, deps, flashinfer, sglang
    assert all("--no-deps --require-hashes" in line and "PIP_CONSTRAINT=/dev/null" in line for line in installs)
    for layer in ("torch", "toolkit", "deps", "flashinfer", "sglang"):
        assert f"COPY lock/{layer}.txt /opt/stackforge/lock/{layer}.txt" in composed.dockerfile
        assert composed.files[f"lock/{layer}.txt"] == layer_requirements_text(lock.layer(layer))
    assert not any(name.startswith("requires/") for name in composed.files)
    assert composed.label("io.stackforge.lock.sha256") == lock.sha256()
    # Another lock is another image: the tag follows the lock.
    other = dataclasses.replace(lock, packages=tuple(dataclasses.replace(p, version="2.5.0") if p.name == "numpy"
                                                     else p for p in lock.packages))
    assert compose_stack(stack, derived, ComposeOptions(wheelhouse=True, no_deps=frozenset({"sglang"}),
                                                        lock=other)).tag != composed.tag


def test_a_lock_without_hashes_installs_without_require_hashes_and_says_so():
    stack, derived, request = _request()
    lock = _lock(request)
    unhashed = dataclasses.replace(lock, packages=tuple(
        dataclasses.replace(p, files=tuple(dataclasses.replace(f, sha256=None) for f in p.files))
        if p.name == "numpy" else p for p in lock.packages))
    assert unhashed.unhashed == ("numpy",)
    dockerfile = compose_stack(stack, derived, ComposeOptions(wheelhouse=True, no_deps=frozenset({"sglang"}),
                                                              lock=unhashed)).dockerfile
    assert "--require-hashes" not in dockerfile and "--no-deps" in dockerfile


def test_the_lock_of_another_stack_is_refused():
    stack, derived, request = _request()
    lock = dataclasses.replace(_lock(request), stack_id="another")
    with pytest.raises(SpecError, match="is the lock of another"):
        compose_stack(stack, derived, ComposeOptions(wheelhouse=True, lock=lock))


# --------------------------------------------------------------------------- lock modes


@pytest.fixture
def no_resolver(monkeypatch):
    """Any resolution fails the test: these modes must work from the recorded lock alone. The index pages
    the recorded hashes are checked against list nothing here (tests/test_build_identity.py checks them)."""
    def refuse(*args, **kwargs):
        raise AssertionError("the resolver was called")
    monkeypatch.setattr(locking, "resolve_lock", refuse)
    monkeypatch.setattr(locking, "project_files", lambda *args, **kwargs: None)


def _record(out: Path, lock: StackLock) -> Path:
    path = locking.lock_path(out, lock.stack_id)
    path.parent.mkdir(parents=True)
    path.write_text(lock.to_toml())
    return path


def test_resolve_mode_reuses_a_recorded_lock_made_for_the_same_inputs(tmp_path, no_resolver):
    _, _, request = _request()
    _record(tmp_path, _lock(request))
    outcome = obtain_lock(request, LockMode.RESOLVE, tmp_path, resolver.ResolverIndexes())
    assert outcome.how == "recorded" and outcome.lock.sha256() == _lock(request).sha256()


def test_a_corrupt_recorded_lock_is_refused_not_replaced(tmp_path, no_resolver):
    _, _, request = _request()
    path = _record(tmp_path, _lock(request))
    path.write_text(path.read_text().replace(SHA["torch"], "zz"))
    for mode in (LockMode.RESOLVE, LockMode.LOCKED, LockMode.RELOCK):
        with pytest.raises(SpecError, match="is not a sha256"):
            obtain_lock(request, mode, tmp_path, resolver.ResolverIndexes())
    assert "zz" in path.read_text()


def test_locked_without_a_recorded_lock_is_refused(tmp_path, no_resolver):
    _, _, request = _request()
    with pytest.raises(SpecError, match="has no recorded lock") as raised:
        obtain_lock(request, LockMode.LOCKED, tmp_path, resolver.ResolverIndexes())
    assert "--relock" in raised.value.remedy


def test_locked_refuses_an_unhashed_lock_before_resolving(tmp_path, no_resolver):
    _, _, request = _request()
    lock = _lock(request)
    _record(tmp_path, dataclasses.replace(lock, packages=tuple(
        dataclasses.replace(p, files=tuple(dataclasses.replace(f, sha256=None) for f in p.files))
        if p.name == "numpy" else p for p in lock.packages)))
    with pytest.raises(SpecError, match="no sha256 for numpy"):
        obtain_lock(request, LockMode.LOCKED, tmp_path, resolver.ResolverIndexes())


def test_locked_refuses_when_the_index_now_resolves_differently_and_relock_takes_it(tmp_path, monkeypatch):
    _, _, request = _request()
    recorded = _lock(request)
    _record(tmp_path, recorded)
    moved = dataclasses.replace(recorded, packages=tuple(dataclasses.replace(p, version="2.5.0") if p.name == "numpy"
                                                         else p for p in recorded.packages))
    monkeypatch.setattr(locking, "resolve_lock", lambda *a, **k: moved)
    with pytest.raises(SpecError, match=r"resolves .* differently from its lock: numpy 2.4.6 -> 2.5.0"):
        obtain_lock(request, LockMode.LOCKED, tmp_path, resolver.ResolverIndexes())
    assert read_stack_lock(locking.lock_path(tmp_path, request.stack_id).read_text(), source="x").versions() == \
        recorded.versions()   # --locked never writes
    outcome = obtain_lock(request, LockMode.RELOCK, tmp_path, resolver.ResolverIndexes())
    assert outcome.how == "resolved"
    assert read_stack_lock(outcome.path.read_text(), source="x").versions()["numpy"] == "2.5.0"
    assert obtain_lock(request, LockMode.LOCKED, tmp_path, resolver.ResolverIndexes()).how == "checked"


def test_build_lock_flags_exclude_each_other():
    result = CliRunner().invoke(cli, ["build", "--locked", "--relock"])
    assert result.exit_code == 2 and "--locked and --relock exclude each other" in result.output


# --------------------------------------------------------------------------- the image against its lock


def test_the_lock_check_passes_only_when_pip_freeze_is_the_lock():
    pins = ["torch==2.13.0+cpu", "numpy==2.4.6"]
    assert lock_check(["numpy==2.4.6", "pip==24.0", "torch==2.13.0+cpu"], pins).status is Status.PASS
    failed = lock_check(["numpy==2.5.0", "pip==24.0", "six==1.16.0"], pins)
    assert failed.status is Status.FAIL
    assert failed.evidence == ("other version: numpy==2.5.0 (lock: numpy==2.4.6); missing: torch==2.13.0+cpu; "
                               "not in the lock: six==1.16.0")


# --------------------------------------------------------------------------- the resolver's errors


def _result(text: str, *, returncode: int = 1, timed_out: bool = False) -> CommandResult:
    return CommandResult(("uv",), returncode, text, 1.0, timed_out, None)


def test_a_conflict_is_a_spec_error_in_the_resolvers_words():
    text = ("  × No solution found when resolving dependencies:\n"
            "  ╰─▶ Because sglang==0.5.23 depends on sglang-kernel==0.4.10 and you require sglang-kernel==0.4.9, we can"
            " conclude that your requirements are unsatisfiable.\n")
    error = resolver._failure(_result(text), ["sglang==0.5.23", "sglang-kernel==0.4.9"])
    assert isinstance(error, resolver.ResolutionConflict) and error.exit_code == 2
    assert "Because sglang==0.5.23 depends on sglang-kernel==0.4.10" in error.message
    assert "╰" not in error.message


def test_an_unreachable_index_is_a_host_error_naming_it():
    text = ("error: Failed to fetch: `https://user:secret@download.pytorch.org/whl/cu130/torch/`\n"
            "  Caused by: error sending request for url (https://user:secret@download.pytorch.org/whl/cu130/torch/)\n")
    error = resolver._failure(_result(text), ["torch==2.9.1+cu130"])
    assert isinstance(error, HostError) and error.exit_code == 3
    assert "download.pytorch.org/whl/cu130" in error.message and "secret" not in error.message


def test_a_resolver_past_its_limit_says_so():
    error = resolver._failure(_result("", returncode=-15, timed_out=True), ["torch==2.13.0"])
    assert "ran past its limit" in error.message


def test_a_build_that_times_out_while_pip_backtracks_says_so():
    from stackforge.build.classify import backtracking_note
    tail = ("#9 41.2 INFO: pip is looking at multiple versions of nvidia-cusolver to determine which version is "
            "compatible with other requirements. This could take a while.\n"
            "#9 97.0 INFO: pip is looking at multiple versions of nvidia-cufft to determine which version is "
            "compatible with other requirements. This could take a while.\n"
            "#9 301.5 INFO: This is taking longer than usual. You might need to provide the dependency resolver "
            "with stricter constraints to reduce runtime.\n")
    note = backtracking_note(tail)
    assert note.startswith("while pip was backtracking through nvidia-cusolver, nvidia-cufft")
    assert "This is taking longer than usual" in note and "stack lock" in note
    assert backtracking_note("#9 12.0 Downloading torch-2.14.1.whl (900 MB)\n") == ""


def test_an_index_url_with_credentials_never_reaches_the_resolver():
    stack, derived = small_cell()
    with pytest.raises(SpecError, match="credentials"):
        lock_request(stack, derived, ComposeOptions(index_url="https://user:token@mirror.example/simple"),
                     glibc="2.36")


def test_uv_installs_only_a_lock_and_never_installs_itself_unpinned():
    from stackforge.build import BuildOptions
    stack, derived, request = _request()
    with pytest.raises(SpecError, match="--installer uv installs a stack lock"):
        compose_stack(stack, derived, ComposeOptions(installer="uv", uv_requirement="uv==0.13.9"))
    with pytest.raises(SpecError, match="needs the pin of the uv"):
        compose_stack(stack, derived, ComposeOptions(installer="uv", lock=_lock(request)))
    with pytest.raises(SpecError, match="which --no-lock turns off"):
        BuildOptions(installer="uv", lock=LockMode.OFF)
    with pytest.raises(SpecError, match="--installer takes pip or uv"):
        compose_stack(stack, derived, ComposeOptions(installer="poetry"))
    options = ComposeOptions(wheelhouse=True, no_deps=frozenset({"sglang"}), installer="uv",
                             uv_requirement="uv==0.13.9")
    assert dict(lock_request(stack, derived, options, glibc="2.36").exact)["installer"] == ("uv==0.13.9",)


def test_lock_changes_tell_the_toolkit_prefix_from_the_venv():
    # The same name in both places (torch's nvidia-cuda-runtime and the toolkit's): each compared with its own.
    _, _, request = _request()
    old = _lock(request)
    venv_runtime = dataclasses.replace(next(p for p in old.packages if p.name == "numpy"), name="nvidia-cuda-runtime",
                                       version="13.0.48", layer="torch")
    old = dataclasses.replace(old, packages=(*old.packages, venv_runtime))
    new = dataclasses.replace(old, packages=tuple(dataclasses.replace(p, version="13.0.97")
                                                  if p.name == "nvidia-cuda-runtime" and p.layer == "toolkit" else p
                                                  for p in old.packages))
    assert lock_changes(old, new) == ["toolkit:nvidia-cuda-runtime 13.0.96 -> 13.0.97"]
    assert old.versions()["nvidia-cuda-runtime"] == new.versions()["nvidia-cuda-runtime"] == "13.0.48"
