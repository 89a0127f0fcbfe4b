"""``probe --image REF``: an image stackforge did not build, probed as the stack its facts make it.

Fast tests: references that do not parse (exit 2, nothing written), the facts an image without Python gives,
the identity, ``upgrade --from-image``'s options, and the matrix attaching wheel readings to an external image by
the context its facts give. Engine tests: an image built OUTSIDE stackforge with a plain Dockerfile (a released
stack pip-installed on the Debian base stackforge uses) is probed: its facts are right, two references of it are
probed once, and it appears in ``matrix``, ``pick`` and ``upgrade --from-image``; an image for arm64, one without
Python and one without torch are skipped saying why; a registry that does not answer exits 3 naming it.

Why this image: a released stack needs real packages for its facts to mean anything, and the smallest real
ones that make a stack are the machine's CPU torch wheel (/opt/wheels, 190 MB, with its five pure-Python
dependencies from the local index) and FlashInfer 0.6.3 and SGLang 0.5.9 from PyPI installed ``--no-deps``
(7 and 5 MB): the pair the default 12.8 stack pins. A CUDA torch is gigabytes; its facts would differ only in
``torch_cuda``, which the fast tests cover.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from stackforge.cli import cli as main
from stackforge.core.records import Outcome, Provenance, ResultRecord, Status, Tier
from stackforge.plan.planner import Plan
from stackforge.probes.image_facts import (
    FoundImage,
    ImageFacts,
    ImageStack,
    matches_image,
    parse_image_ref,
    parse_reader_output,
)
from stackforge.report.compat_matrix import build_matrix

TARGET = "rtx-pro-6000-x8-pcie"
IMAGE_ID = "sha256:" + "ab" * 32
DIGEST = "sha256:" + "cd" * 32


def _found(**overrides) -> FoundImage:
    values = dict(name=parse_image_ref("ghcr.io/acme/sglang:v1"), image_id=IMAGE_ID,
                  repo_digest=f"ghcr.io/acme/sglang@{DIGEST}", platform="linux/amd64", refs=("ghcr.io/acme/sglang:v1",))
    values.update(overrides)
    return FoundImage(**values)


def _facts(**overrides) -> ImageFacts:
    values = dict(python="3.12.3", versions={"torch": "2.9.1+cu128", "flashinfer-python": "0.6.3",
                                             "sglang": "0.5.9", "sgl-kernel": "0.3.21"},
                  torch_cuda="12.8", nvcc="12.8", os="Ubuntu 24.04.1 LTS", glibc="2.39")
    values.update(overrides)
    return ImageFacts(**values)


# ---------------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("ref", ["Bad Ref!!", "acme/sglang@sha256:12", "acme/sglang:bad tag", "acme/sglang:-x"])
def test_a_reference_that_does_not_parse_exits_2_and_writes_nothing(tmp_path: Path, ref: str) -> None:
    result = CliRunner().invoke(main, ["probe", "--image", ref, "--results", str(tmp_path / "r")])
    assert result.exit_code == 2, result.output
    assert result.output.startswith("stackforge: error: ") and len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()


def test_an_images_file_names_the_line_that_does_not_parse(tmp_path: Path) -> None:
    refs = tmp_path / "refs.txt"
    refs.write_text("# the images we run\nlmsysorg/sglang:v0.5.9\n\nNOT/A REF\n")
    result = CliRunner().invoke(main, ["probe", "--images-file", str(refs), "--results", str(tmp_path / "r")])
    assert result.exit_code == 2, result.output
    assert f"{refs}:4:" in result.output


def test_image_refuses_local_and_only(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["probe", "--image", "acme/x:1", "--local", "--results", str(tmp_path)])
    assert result.exit_code == 2 and "cannot be combined" in result.output


def test_references_parse_to_repository_tag_and_digest() -> None:
    name = parse_image_ref(f"127.0.0.1:5000/team/sglang:v1@{DIGEST}")
    assert (name.repository.host, name.repository.path, name.tag, name.digest) == (
        "127.0.0.1:5000", "team/sglang", "v1", DIGEST)
    assert parse_image_ref("ubuntu").repository.path == "library/ubuntu"
    assert parse_image_ref(IMAGE_ID).repository is None


# ---------------------------------------------------------------------------------------------- facts


def test_an_image_without_python_says_so_from_the_shell() -> None:
    output = ("STACKFORGE_NO_PYTHON\nOSREL PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nOSREL ID=debian\n"
              "LIBC glibc 2.36\nMACHINE x86_64\n")
    facts = parse_reader_output(output)
    assert facts is not None and facts.python is None
    assert (facts.os, facts.glibc, facts.machine) == ("Debian GNU/Linux 12 (bookworm)", "2.36", "x86_64")
    stack = ImageStack(_found(), facts)
    assert stack.why_not == "the image has no Python (no python3 or python on its PATH)"


def test_no_torch_and_another_platform_are_reasons_not_errors() -> None:
    assert "has no torch" in ImageStack(_found(), _facts(versions={"sglang": "0.5.9"})).why_not
    other = ImageFacts(unreadable="the image is for linux/arm64, this engine runs linux/amd64: not run here")
    assert "linux/arm64" in ImageStack(_found(platform="linux/arm64"), other).why_not
    assert ImageStack(_found(), _facts()).why_not is None


def test_the_identity_is_the_image_never_a_matrix_stack() -> None:
    stack = ImageStack(_found(), _facts())
    assert stack.id == "image-sglang-abababababab"
    assert ImageStack(_found(), _facts(python="3.11.9")).id == stack.id   # the image decides, not a reading
    data = stack.to_json()
    assert data["external"] is True and data["image"] == f"ghcr.io/acme/sglang@{DIGEST}"
    assert (data["cuda"], data["python"], data["torch"], data["kernel"]) == ("12.8", "3.12", "2.9.1+cu128", "0.3.21")
    assert data["derived"] == {"has_nvcc": True, "torch_cuda": "12.8", "kernel_package": "sgl-kernel",
                               "kernel_version": "0.3.21"}
    # An image only built here has no registry digest: its reference, never its image id dressed as one.
    assert ImageStack(_found(repo_digest=None), _facts()).to_json()["image"] == "ghcr.io/acme/sglang:v1"


def test_an_image_is_found_by_any_of_its_names() -> None:
    stack = ImageStack(_found(), _facts()).to_json()
    for ref in ("ghcr.io/acme/sglang:v1", f"ghcr.io/acme/sglang@{DIGEST}", DIGEST, f"other/name@{DIGEST}",
                IMAGE_ID, "abababababab"):
        assert matches_image(stack, ref), ref
    assert not matches_image(stack, "ghcr.io/acme/sglang:v2")
    assert not matches_image({**stack, "external": False}, DIGEST)


# ---------------------------------------------------------------------------------------------- reports


def _record(stack: dict, stack_id: str, *, tier: Tier, feature: str, probe: str, status: Status,
            versions: dict | None = None) -> ResultRecord:
    return ResultRecord(run_id="20261205T000000Z-aaaaaa", stack_id=stack_id, stack=stack, target=TARGET, probe=probe,
                        feature=feature, tier=tier, outcome=Outcome(status, f"{probe} said {status.value}"),
                        provenance=Provenance(versions=versions or {}), created_at="2026-12-05T00:00:00+00:00")


def test_the_matrix_gives_an_external_image_the_wheel_readings_of_its_releases_in_its_context() -> None:
    """A wheel reading that depends on nvcc speaks for the image only when the image's read facts match: the
    record's ``derived`` stands in for the plan cell the image does not have (without it nothing attached)."""
    image = ImageStack(_found(), _facts()).to_json()
    gate = _record(image, "image-sglang-abababababab", tier=Tier.GATE, feature="torch-kernels",
                   probe="gate.torch.arch-list", status=Status.PASS)
    reading = {"flashinfer": "0.6.3", "nvcc": True, "depends_on": ["nvcc"]}
    wheel = _record(reading, "wheel-flashinfer-python-0.6.3-nvcc", tier=Tier.WHEEL, feature="flashinfer-jit",
                    probe="wheel.flashinfer-python.flashinfer-jit", status=Status.FAIL,
                    versions={"flashinfer-python": "0.6.3"})
    other = _record({**reading, "nvcc": False}, "wheel-flashinfer-python-0.6.3-nonvcc", tier=Tier.WHEEL,
                    feature="flashinfer-jit", probe="wheel.flashinfer-python.flashinfer-jit.x", status=Status.PASS,
                    versions={"flashinfer-python": "0.6.3"})
    report = build_matrix([gate, wheel, other], Plan.empty(), TARGET)
    row = report.row("image-sglang-abababababab")
    assert row.derived == image["derived"]
    cell = row.cell("flashinfer-jit")
    assert [r.stack_id for r in cell.records] == ["wheel-flashinfer-python-0.6.3-nvcc"]


def test_upgrade_from_image_options(tmp_path: Path) -> None:
    from stackforge.cli.upgrade import _choices

    before, after = _choices((), None, "13.1", "acme/sglang:v1", None)
    assert (before.image, after.cuda) == ("acme/sglang:v1", "13.1")
    result = CliRunner().invoke(main, ["upgrade", "--from-image", "a/b:1", "--from-cuda", "12.8", "--to-cuda", "13.1",
                                       "--results", str(tmp_path)])
    assert result.exit_code == 2 and "--from-cuda and --from-image" in result.output


# ---------------------------------------------------------------------------------------------- the engine


@pytest.fixture(scope="module")
def hand_made_image(docker_client, base_image, tmp_path_factory) -> str:
    """A released stack pip-installed with a plain Dockerfile, no stackforge involved (module docstring)."""
    context = tmp_path_factory.mktemp("hand-made")
    wheels = sorted(Path("/opt/wheels").glob("torch-2.13.0+cpu-cp311-*.whl"))
    if not wheels:
        pytest.skip("no CPU torch 2.13.0 wheel for cp311 in /opt/wheels")
    shutil.copy(wheels[-1], context)
    pip = subprocess.run(["python3", "-m", "pip", "download", "-q", "--no-deps", "-d", str(context),
                          "--python-version", "3.11", "--only-binary", ":all:", "flashinfer-python==0.6.3",
                          "sglang==0.5.9", "filelock", "typing-extensions", "sympy", "mpmath", "networkx", "jinja2",
                          "markupsafe", "fsspec"], capture_output=True, text=True, timeout=600)
    if pip.returncode != 0:
        pytest.skip(f"pip cannot download the stack's wheels: {pip.stderr[-300:]}")
    (context / "Dockerfile").write_text(
        f"FROM {base_image}\nCOPY *.whl /tmp/wheels/\n"
        "RUN python3 -m pip install --break-system-packages --no-index --no-deps --no-cache-dir /tmp/wheels/*.whl "
        "&& rm -rf /tmp/wheels\n")
    tag = "stackforge-test/hand-made:fi0.6.3"
    docker_client.images.build(path=str(context), tag=tag, network_mode="host", rm=True)
    yield tag
    docker_client.images.remove(tag, force=True)


def _records(results: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in results.glob("*/image-*/*/*.json")]


@pytest.mark.docker
@pytest.mark.pypi
def test_a_hand_made_image_is_probed_and_takes_part_in_the_reports(hand_made_image: str, docker_client,
                                                                   tmp_path: Path) -> None:
    results = tmp_path / "results"
    image_id = docker_client.images.get(hand_made_image).id
    by_id = image_id                       # a second reference of the same image: probed once
    probe = CliRunner().invoke(main, ["probe", "--image", hand_made_image, "--image", by_id, "--target", TARGET,
                                      "--results", str(results)])
    assert probe.exit_code == 0, probe.output
    records = _records(results)
    assert records and {r["stack_id"] for r in records} == {f"image-hand-made-{image_id[7:19]}"}
    stack = records[0]["stack"]
    facts = stack["facts"]
    assert stack["external"] is True and stack["refs"] == [hand_made_image, by_id]
    assert facts["python"].startswith("3.11.") and facts["versions"] == {
        "torch": "2.13.0+cpu", "flashinfer-python": "0.6.3", "sglang": "0.5.9"}
    assert (facts["torch_cuda"], facts["nvcc"], facts["glibc"]) == (None, None, "2.36")
    assert facts["os"] == "Debian GNU/Linux 12 (bookworm)" and facts["cuda_libraries"] == {}
    # the gate tier ran in it: torch's arch list measured (a CPU build has none), not skipped
    arch = next(r for r in records if r["probe"] == "gate.torch.arch-list")
    assert arch["outcome"]["status"] != "skip" and arch["provenance"]["image_id"] == image_id
    stack_id = records[0]["stack_id"]

    matrix = CliRunner().invoke(main, ["matrix", "--target", TARGET, "--results", str(results)])
    assert matrix.exit_code == 0 and f"{stack_id} (external image {hand_made_image})" in matrix.stdout
    wheel_row = next(line for line in matrix.stdout.splitlines() if line.strip().startswith("trtllm-gen-fmha"))
    assert wheel_row.split()[1:3] == ["fail", "(wheel)"]    # FlashInfer 0.6.3's own code read for the image
    pick = CliRunner().invoke(main, ["pick", "--target", TARGET, "--results", str(results), "--format", "json"])
    assert stack_id in pick.output
    upgrade = CliRunner().invoke(main, ["upgrade", "--from-image", hand_made_image, "--to-cuda", "13.1", "--target",
                                        TARGET, "--results", str(results)])
    assert upgrade.exit_code == 0, upgrade.output
    assert f"from {stack_id} (measured)" in upgrade.stdout
    assert upgrade.stdout.startswith(f"upgrade CUDA no CUDA (image {hand_made_image}) -> 13.1")


@pytest.fixture(scope="module")
def odd_images(docker_client, base_image, tmp_path_factory) -> dict[str, str]:
    """An arm64 image (FROM scratch, one file), one without Python, and the Debian base (Python, no torch)."""
    context = tmp_path_factory.mktemp("odd")
    (context / "hello").write_text("hi\n")
    (context / "Dockerfile").write_text("FROM scratch\nCOPY hello /hello\n")
    arm = "stackforge-test/arm-only:1"
    built = subprocess.run(["docker", "buildx", "build", "-q", "--platform", "linux/arm64", "--load", "-t", arm,
                            str(context)], capture_output=True, text=True, timeout=300)
    if built.returncode != 0:
        pytest.skip(f"buildx cannot build an arm64 image here: {built.stderr[-300:]}")
    no_python = "stackforge-test/no-python:1"
    (context / "Dockerfile").write_text(f"FROM {base_image}\nRUN rm -f /usr/bin/python3* /usr/bin/python\n")
    docker_client.images.build(path=str(context), tag=no_python, network_mode="host", rm=True)
    yield {"arm": arm, "no_python": no_python, "no_torch": base_image}
    for tag in (arm, no_python):
        docker_client.images.remove(tag, force=True)


@pytest.mark.docker
def test_images_the_probes_cannot_run_in_are_skipped_saying_why(odd_images: dict[str, str], tmp_path: Path) -> None:
    results = tmp_path / "results"
    args = ["probe", "--target", TARGET, "--results", str(results), "--tier", "gate"]
    for ref in odd_images.values():
        args += ["--image", ref]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    reasons: dict[str, set[str]] = {}
    for record in _records(results):
        assert record["outcome"]["status"] == "skip", record
        reasons.setdefault(record["stack"]["refs"][0], set()).add(record["outcome"]["reason"])
    assert reasons[odd_images["arm"]] == {"the image is for linux/arm64, this engine runs linux/amd64: not run here"}
    assert reasons[odd_images["no_python"]] == {"the image has no Python (no python3 or python on its PATH)"}
    assert reasons[odd_images["no_torch"]] == {
        "the image has no torch (its Python 3.11.2 has no torch distribution installed)"}


@pytest.mark.docker
def test_a_registry_that_does_not_answer_exits_3_naming_it(docker_client, tmp_path: Path) -> None:
    ref = f"127.0.0.1:9/nothing/here@sha256:{'0' * 64}"
    result = CliRunner().invoke(main, ["probe", "--image", ref, "--results", str(tmp_path / "r")])
    assert result.exit_code == 3, result.output
    assert "registry 127.0.0.1:9 does not answer" in result.output
    assert not (tmp_path / "r").exists()


def test_an_image_gets_the_driver_floor_the_rules_give_it_for_the_host_check() -> None:
    """Issue 35's driver check needs each job's floor: an external image's comes from the rules judging what it
    was read to have, under the image's own id (an image the rules cannot judge has none)."""
    from stackforge.plan.planner import load_knowledge
    from stackforge.probes.campaign import image_driver_floors

    target = load_knowledge().targets[TARGET]
    stack = ImageStack(_found(), _facts())
    floors = image_driver_floors([stack], [target])
    assert floors[(stack.id, TARGET)] == "570.26"          # CUDA 12.8's minor-version floor (compat/tables.yaml)
    no_torch = ImageStack(_found(image_id="sha256:" + "cd" * 32), _facts(versions={}))
    assert image_driver_floors([no_torch], [target]) == {}
