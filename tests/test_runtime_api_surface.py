"""The GPU-only code paths call the real projects' APIs as those releases define them.

No GPU is needed to catch API drift: the runtime probes and benches name torch's symmetric-memory
ops and SGLang's custom all-reduce methods, and a CUDA build of torch registers those ops (with
their schemas) even on a machine without a GPU, while SGLang's classes can be read from its files.
These tests compare what the scripts call with what the installed releases define, so a rename or
a signature change shows up here, not first on a rented GPU box.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PROBES = REPO / "stackforge" / "probes" / "scripts"
BENCH = REPO / "stackforge" / "bench" / "scripts"
sys.path[:0] = [str(PROBES), str(BENCH)]
import allreduce_sweep  # noqa: E402  (in-image script: imports the stdlib helpers beside it only)
import symm_mem  # noqa: E402
from test_probe_scripts import cuda_torch_python, fi063_python, fi072_python  # noqa: E402,F401  (venv fixtures)

#: Every torch.ops.symm_mem op the probe and the bench call, with the arguments they pass.
CALLED_OPS = {
    **{op: ("input", "reduce_op", "group_name") for op in symm_mem.OPS},
    **{name: ("input", "reduce_op", "group_name", "out") if has_out else ("input", "reduce_op", "group_name")
       for name, has_out in allreduce_sweep.SymmMemBackend._OPS.values()},
}

#: What the custom all-reduce probe and bench use on whichever class SGLang's dispatcher returns.
CUSTOM_AR_METHODS = ("should_custom_ar", "custom_all_reduce", "capture", "close")


def test_symm_mem_ops_exist_with_the_arguments_the_scripts_pass(cuda_torch_python):
    code = textwrap.dedent(f"""
        import inspect, json, torch
        import torch.distributed._symmetric_memory as symm_mem
        ops = {{}}
        for name in {sorted(CALLED_OPS)!r}:
            schema = getattr(torch.ops.symm_mem, name).default._schema
            ops[name] = [[a.name, str(a.type)] for a in schema.arguments]
        print(json.dumps({{"torch": torch.__version__, "ops": ops,
                          "empty": list(inspect.signature(symm_mem.empty).parameters),
                          "rendezvous": list(inspect.signature(symm_mem.rendezvous).parameters)}}))
    """)
    done = subprocess.run([str(cuda_torch_python), "-c", code], capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    for name, arguments in CALLED_OPS.items():
        schema = seen["ops"][name]
        assert len(schema) == len(arguments), f"torch {seen['torch']}: {name}{schema} vs call {arguments}"
        assert [t for _, t in schema[:3]] == ["Tensor", "str", "str"], (name, schema)
        if len(arguments) == 4:
            assert schema[3][1] == "Tensor", (name, schema)
    assert seen["empty"] == ["size", "dtype", "device"], seen["empty"]  # empty(numel, dtype=, device=)
    assert seen["rendezvous"][:2] == ["tensor", "group"], seen["rendezvous"]


def _class_api(path: Path, class_name: str) -> tuple[set[str], list[str], bool]:
    """(method names, __init__ parameter names, sets self.disabled) of a class in an SGLang file."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name)
    methods = {n.name for n in cls.body if isinstance(n, ast.FunctionDef)}
    init = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    params = [a.arg for a in (*init.args.args, *init.args.kwonlyargs)]
    disabled = any(isinstance(t, ast.Attribute) and t.attr == "disabled"
                   for n in ast.walk(init) if isinstance(n, ast.Assign) for t in n.targets)
    return methods, params, disabled


def _sglang_file(python: Path, relative: str) -> Path:
    found = sorted(python.parent.parent.glob(f"lib/python*/site-packages/sglang/{relative}"))
    assert found, f"sglang/{relative} not in the venv of {python}"
    return found[0]


@pytest.mark.parametrize(("fixture", "classes"), [
    ("fi063_python", (("srt/distributed/device_communicators/custom_all_reduce.py", "CustomAllreduce"),)),
    ("fi072_python", (("srt/distributed/device_communicators/custom_all_reduce.py", "CustomAllreduce"),
                      ("srt/distributed/device_communicators/custom_all_reduce_v2.py", "CustomAllReduceV2"))),
])
def test_every_custom_allreduce_class_has_what_the_probe_and_bench_call(request, fixture, classes):
    """SGLang 0.5.9 and 0.5.23: each class the dispatcher can return takes group=, device=,
    max_size= and has the methods and the ``disabled`` flag the scripts use."""
    python = request.getfixturevalue(fixture)
    for relative, class_name in classes:
        methods, params, disabled = _class_api(_sglang_file(python, relative), class_name)
        assert set(CUSTOM_AR_METHODS) <= methods, (class_name, sorted(set(CUSTOM_AR_METHODS) - methods))
        assert {"group", "device", "max_size"} <= set(params), (class_name, params)
        assert disabled, f"{class_name}.__init__ no longer sets self.disabled"
