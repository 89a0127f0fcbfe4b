"""Gate probe ``torch-kernels``: does this torch build carry kernels for the target arch?

Reads the arch list torch was compiled with (``torch._C._cuda_getArchFlags()``, the string behind
``torch.cuda.get_arch_list()``, which itself returns [] when no GPU is visible) and decides:

- pass: SASS for the target (``sm_120``) or a lower SASS of the same major that torch's own rule
  (``torch.cuda._code_compatible_with_device`` when this torch has it) says runs on the target;
- pass: no such SASS but PTX (``compute_XY``, XY <= target) that the driver can JIT to the target
  (first use is slow; the reason says so);
- fail: neither (the user would see "no kernel image is available for execution on the device"),
  or torch is a CPU build.

No GPU needed.
"""

from __future__ import annotations

import re
import sys
import warnings
from collections.abc import Sequence
from typing import Any

import _sfprobe as sf

ENTRY = re.compile(r"(sm|compute)_(\d+)([af]?)")


def parse_arch_entries(flags: str) -> tuple[list[tuple[str, int, str]], list[str]]:
    """Split ``"sm_90 sm_120 compute_120"`` into (kind, number, suffix) triples; unknown words
    are returned separately so they show up in the evidence instead of vanishing."""
    entries, unknown = [], []
    for word in flags.split():
        match = ENTRY.fullmatch(word)
        if match:
            entries.append((match.group(1), int(match.group(2)), match.group(3)))
        else:
            unknown.append(word)
    return entries, unknown


def sass_runs_on(torch: Any, code: int, suffix: str, target: sf.Arch) -> tuple[bool, str]:
    """Whether SASS built for ``code`` runs on the target, and which rule said so.

    torch >= 2.10 ships ``torch.cuda._code_compatible_with_device`` (the table behind its own
    "not compatible with the current PyTorch installation" warning); older torch only has the
    documented CUDA rule: same major, code minor <= device minor; ``a`` cubins run on exactly
    their own arch.
    """
    if suffix == "a":
        return code == target.sm, "arch-specific (a) SASS runs only on its own arch"
    rule = getattr(torch.cuda, "_code_compatible_with_device", None)
    if rule is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # it warns about codes it does not know
            return bool(rule(target.sm, code)), "torch.cuda._code_compatible_with_device"
    return code // 10 == target.major and code % 10 <= target.minor, "CUDA rule: same major, minor <= target"


def ptx_jits_to(code: int, suffix: str, target: sf.Arch) -> bool:
    """PTX for compute_XY JIT-compiles on any device >= XY, except arch-specific (``a``) PTX."""
    return suffix != "a" and code <= target.sm


def decide(torch: Any, target: sf.Arch, facts: dict[str, Any]) -> None:
    """Emit the result for an importable torch."""
    cuda = torch.version.cuda
    label = f"torch {torch.__version__}"
    if cuda is None:
        if getattr(torch.version, "hip", None):
            sf.emit("skip", f"{label} is a ROCm build (torch.version.hip={torch.version.hip}); "
                    "CUDA targets do not apply", evidence=f"torch.version.hip = {torch.version.hip!r}",
                    facts=facts)
        sf.emit("fail", "torch is a CPU build: torch.version.cuda is None",
                evidence=f"{label}: torch.version.cuda = None, torch.version.git_version = "
                f"{torch.version.git_version}", facts=facts)
    flags = sf.torch_arch_flags(torch)
    if flags is None:
        sf.emit("error", f"{label} (CUDA {cuda}) exposes no compiled arch list "
                "(torch._C._cuda_getArchFlags missing or failing)", facts=facts)
    entries, unknown = parse_arch_entries(flags)
    evidence = (f"torch._C._cuda_getArchFlags() = {flags!r}; torch.version.cuda = {cuda!r}; "
                f"torch.version.git_version = {torch.version.git_version!r}")
    sass_hits, rule_used = [], ""
    for kind, code, suffix in entries:
        if kind == "sm":
            runs, rule_used = sass_runs_on(torch, code, suffix, target)
            if runs:
                sass_hits.append(f"sm_{code}{suffix}")
    ptx_hits = [f"compute_{code}{suffix}" for kind, code, suffix in entries
                if kind == "compute" and ptx_jits_to(code, suffix, target)]
    metrics = {"sass": [f"sm_{c}{s}" for k, c, s in entries if k == "sm"],
               "ptx": [f"compute_{c}{s}" for k, c, s in entries if k == "compute"],
               "sass_for_target": sass_hits, "ptx_for_target": ptx_hits,
               "compat_rule": rule_used, "unrecognised_entries": unknown}
    who = f"{label} (CUDA {cuda})"
    if sass_hits:
        exact = target.sm_name in sass_hits
        how = "has" if exact else "has no exact " + target.sm_name + " but its"
        sf.emit("pass", f"{who} {how} SASS {', '.join(sass_hits)} that runs on {target.sm_name}",
                evidence=evidence, metrics=metrics, facts=facts)
    if ptx_hits:
        sf.emit("pass", f"{who} has no SASS for {target.sm_name}; PTX {', '.join(ptx_hits)} JIT-compiles "
                "to it at first use (slow first start, cached afterwards)",
                evidence=evidence, metrics=metrics, facts=facts)
    sf.emit("fail", f"{who} has neither SASS for {target.sm_name} nor PTX <= compute_{target.sm}: "
            "kernels fail with 'no kernel image is available for execution on the device'",
            evidence=evidence, metrics=metrics, facts=facts)


def main(argv: Sequence[str]) -> None:
    args = sf.common_parser(__doc__.splitlines()[0]).parse_args(argv)
    torch, error = sf.try_import("torch")
    if torch is None:
        facts = sf.collect_facts(import_torch=False)
        if "No module named 'torch'" in error:
            sf.emit("skip", "torch is not installed in this image", evidence=error, facts=facts)
        sf.emit("fail", f"torch is installed but fails to import: {error}", evidence=error, facts=facts)
    decide(torch, args.arch, sf.collect_facts(torch_module=torch))


if __name__ == "__main__":
    sf.run_main(main, sys.argv[1:])
