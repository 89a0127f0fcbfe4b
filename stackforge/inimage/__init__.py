"""The code that runs inside stack images or reads their files (standard library only).

The probe and bench scripts run inside images where stackforge is not installed. What they share
with each other and with the host lives here, in one folder that the job runner mounts read-only at
:data:`CONTAINER_DIR` for every script and puts on ``PYTHONPATH`` (a ``--local`` run points it at
this folder), so a script imports these modules by file name:

* ``_sfshared``: the result-line contract, nccl-tests' bandwidth formulas, GEMM throughput, summary
  statistics, ``json_safe`` and the image facts (the build's verification runs this file inside the
  image as a ``python -c`` program);
* ``_sfprobe``: the probe harness (result line, facts, rank processes, patched gates), which the bench
  scripts use too;
* ``_sglang_source``: SGLang's own files read with ``ast``, and the one decider of SGLang's
  communicator gates, over an installed package (in-image probes) or an unpacked wheel (the wheel
  tier's readers);
* ``_sffatbin``: fatbin containers (which SASS / PTX archs device code carries), read by the gate probe
  ``kernel_cubins.py`` from files and by the wheel tier's binary readers from wheel members;
* ``_sfstub``: a ``libcuda.so.1`` stand-in written from ``cuda.h`` without a compiler, so that the gate
  probe ``stack_imports.py`` can load the extensions of an image that has neither driver nor link stub.

On the host the same files are imported as ``stackforge.inimage.<module>``. Nothing in this folder
may import beyond the standard library, nor anything of stackforge besides these files.
"""

from __future__ import annotations

from pathlib import Path

#: This folder on the host (mounted into containers, or on ``PYTHONPATH`` for a local run).
HOST_DIR = Path(__file__).resolve().parent
#: Where :data:`HOST_DIR` is mounted in a container.
CONTAINER_DIR = "/stackforge/inimage"
