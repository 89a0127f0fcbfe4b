"""Stacks and derived facts shared by the render and build tests.

``derived_by_hand`` builds a :class:`~stackforge.plan.derive.Derived` without the tables, so render tests
pin every fact they depend on; ``small_cell`` is the real, small stack the integration tests and the
benchmark build on this machine (see tests/test_build_integration.py for why it looks like this).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import pytest

from stackforge.core.model import Flavour, Stack
from stackforge.plan.derive import Derived, derive, load_tables

WHEELHOUSE = "/opt/wheels"
SYSTEM_CA = "/etc/ssl/certs/ca-certificates.crt"


def derived_by_hand(**overrides: Any) -> Derived:
    """A devel cu130 stack's facts; override what a test is about."""
    values: dict[str, Any] = dict(
        torch_variant="cu130", torch_cuda="13.0", torch_index_url="https://download.pytorch.org/whl/cu130",
        torch_requirement="torch==2.14.1", kernel_package="sglang-kernel", kernel_version="0.4.10",
        flashinfer_extra="cu13", cuda_image_version="13.1.0", base_image="nvidia/cuda:13.1.0-devel-ubuntu24.04",
        base_python="3.12", toolkit_wheels={}, has_nvcc=True)
    values.update(overrides)
    return Derived(**values)


def devel_stack(**overrides: Any) -> Stack:
    values: dict[str, Any] = dict(cuda="13.1", torch="2.14.1", flashinfer="0.7.2", sglang="0.5.23", python="3.12")
    values.update(overrides)
    return Stack(**values)


def wheels_stack(cuda: str = "13.0", **overrides: Any) -> Stack:
    values: dict[str, Any] = dict(cuda=cuda, torch="2.14.1", flashinfer="0.7.2", sglang="0.5.23", python="3.11",
                                  flavour=Flavour.WHEELS, os="debian12")
    values.update(overrides)
    return Stack(**values)


def small_cell(flashinfer: str = "0.6.6", sglang: str = "0.5.9", cuda: str = "13.0") -> tuple[Stack, Derived]:
    """The small real stack built on this machine.

    * torch 2.13.0+cpu from the machine's wheelhouse (a real torch, 190 MB instead of GBs);
    * the CUDA 13.0 toolkit wheels (real nvcc, so the nvcc check runs), wheels flavour on Debian 12
      with Python 3.11 (the bootstrapped base stands in for python:3.11-slim-bookworm);
    * a real FlashInfer 0.6.x from PyPI with its dependencies (7-9 MB wheels);
    * SGLang from PyPI with --no-deps (the caller passes no_deps={"sglang"}): its dependencies pin
      torch 2.9.1 + CUDA kernels (gigabytes); the image's labels say it was installed --no-deps;
    * no separate kernel package (sgl-kernel wheels are 300+ MB of CUDA kernels).
    """
    stack = Stack(cuda=cuda, torch="2.13.0", flashinfer=flashinfer, sglang=sglang, python="3.11",
                  flavour=Flavour.WHEELS, os="debian12", torch_variant="cpu")
    derived = dataclasses.replace(derive(stack, load_tables()), kernel_package=None, kernel_version=None)
    return stack, derived


def wait_while_running(condition, process, *, timeout: float, what: str) -> None:
    """Wait until ``condition()`` holds while ``process`` (a Popen) still runs; fail naming ``what`` it was
    waiting for when the process ends first or ``timeout`` seconds pass (tests that interrupt a command)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if process.poll() is not None:
            pytest.fail(f"the command ended before it could be interrupted: {process.stdout.read()}")
        assert time.monotonic() < deadline, f"the command never reached {what}"
        time.sleep(0.2)
