"""The feature catalog (``compat/knowledge.yaml``): the question each feature answers, what each tier can
conclude about it, and the hardware it cannot exist without.

Two limits of evidence live here, as data, so that no report says more than its evidence shows:

* **decidability**: a tier either *decides* a feature (its pass answers the question: the arch list names
  sm_120, a kernel ran and its output was checked), *builds* it (its pass compiled and linked the module the
  target uses, with nothing loaded or run: the cell is ``built`` when the record says it built, else
  ``admitted``), or only shows that the code *admits* the target (a reading of the code, a gate that compiles
  or runs nothing). A pass of an admitting tier makes the cell ``admitted``, never ``pass``; a refusal is a
  ``fail`` in every tier.
* **what the code path needs**: a feature whose serving code JIT-builds a FlashInfer module (``jit:
  flashinfer``) fails on an image that measured it cannot JIT (no nvcc and nothing prebuilt covers the
  modules), whatever a reading of the code admits.
* **applicability**: a feature may need hardware the target lacks (NVLink, multicast, an RDMA NIC, several
  GPUs or nodes). On such a target the cell is ``n/a`` with the reason, and it counts nowhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from stackforge.core.data import data_dir
from stackforge.core.errors import SpecError
from stackforge.core.model import Target
from stackforge.core.records import BUILT, ResultRecord, Status, Tier, says_built
from stackforge.core.yamlio import LineDict, check_keys, load_file, require_mapping

#: What a pass of a tier concludes about a feature.
DECIDES = "decides"
BUILDS = "builds"
ADMITS = "admits"
CONCLUSIONS = (DECIDES, BUILDS, ADMITS)
#: The status word of a pass that only shows the code admits the target.
ADMITTED_STATUS = "admitted"
#: The compilers a feature's serving code path may need (``jit:``).
JIT_KINDS = ("flashinfer",)
#: What a benchmark concludes about a feature of the catalog: numbers, never a verdict on the capability
#: (a two-shot symmetric-memory sweep passing on PCIe says nothing of torch-symm-mem as SGLang uses it).
METRICS = "metrics"
#: The hardware words of ``needs`` (:attr:`stackforge.core.model.Target.hardware`).
HARDWARE = ("nvlink", "multicast", "rdma", "multi-gpu", "multi-node")
#: What a tier concludes when the catalog does not list it: a GPU run decides, a reading only admits.
_UNLISTED = {Tier.RUNTIME: DECIDES, Tier.BENCH: DECIDES, Tier.GATE: ADMITS, Tier.WHEEL: ADMITS}
_HARDWARE_TEXT = {"nvlink": "NVLink", "multicast": "NVLink multicast", "rdma": "an RDMA NIC",
                  "multi-gpu": "two or more GPUs", "multi-node": "several nodes"}


@dataclass(frozen=True, slots=True)
class HardwareNeed:
    """One thing a feature cannot exist without: any one of ``any_of`` is enough."""

    any_of: tuple[str, ...]
    why: str
    sources: tuple[dict[str, str], ...] = ()

    def met_by(self, hardware: frozenset[str]) -> bool:
        return any(name in hardware for name in self.any_of)

    def text(self) -> str:
        """``needs NVLink or an RDMA NIC: <why>``."""
        return f"needs {' or '.join(_HARDWARE_TEXT[n] for n in self.any_of)}: {self.why}"


@dataclass(frozen=True, slots=True)
class FeatureSpec:
    """One feature: its question, what each tier concludes, and the hardware it needs."""

    name: str
    question: str
    tiers: tuple[tuple[Tier, str], ...] = ()
    needs: tuple[HardwareNeed, ...] = ()
    rests_on: tuple[str, ...] = ()   # features whose failure on the same host in the same run is the host's
    jit: str = ""                    # "flashinfer": its serving code path JIT-builds a FlashInfer module

    def conclusion(self, tier: Tier) -> str:
        """``decides``, ``admits`` or ``metrics``: what a pass of ``tier`` shows about this feature. A bench
        only measures a feature of the catalog; a feature only benchmarks speak for (``serve``) it decides."""
        if tier is Tier.BENCH and self.question:
            return METRICS
        return dict(self.tiers).get(tier, _UNLISTED[tier])

    def decided_by(self, tier: Tier) -> bool:
        """Whether a record of ``tier`` can decide this feature's cell at all (a bench's cannot, in the catalog)."""
        return self.conclusion(tier) != METRICS

    def only_admits(self, tier: Tier) -> bool:
        """A pass of ``tier`` does not decide the feature: it admits the target, or at most built its module."""
        return self.conclusion(tier) in (ADMITS, BUILDS)

    def builds(self, tier: Tier) -> bool:
        """A pass of ``tier`` that says it built the module (``evidence_level: built``) makes the cell ``built``."""
        return self.conclusion(tier) == BUILDS

    def deciding_tiers(self) -> tuple[Tier, ...]:
        return tuple(tier for tier, conclusion in self.tiers if conclusion == DECIDES)

    def not_applicable(self, target: Target | None) -> str:
        """Why ``target`` cannot have this feature (``""`` when it can, or when the target is unknown)."""
        if target is None:
            return ""
        hardware = target.hardware
        missing = [need.text() for need in self.needs if not need.met_by(hardware)]
        return f"n/a on {target.name}: " + "; ".join(missing) if missing else ""


@dataclass(frozen=True, slots=True)
class FeatureCatalog:
    """Every feature of ``compat/knowledge.yaml``, by name."""

    features: Mapping[str, FeatureSpec]

    def spec(self, name: str) -> FeatureSpec:
        """The feature's spec; a name the catalog lacks (a feature only results know) gets the defaults."""
        return self.features.get(name) or FeatureSpec(name=name, question="")

    def questions(self) -> dict[str, str]:
        return {name: spec.question for name, spec in self.features.items()}

    def calibrated_status(self, record: ResultRecord) -> str:
        """The record's status in the words a report uses for it alone: a pass of a tier that only admits the
        feature is ``admitted`` (or ``built`` when it built the module), never ``pass``."""
        status = record.outcome.status
        spec = self.spec(record.feature)
        if status is not Status.PASS or not spec.only_admits(record.tier):
            return status.value
        return BUILT if spec.builds(record.tier) and says_built(record) else ADMITTED_STATUS


def load_feature_catalog(path: Path | None = None) -> FeatureCatalog:
    """Read the ``features`` of ``compat/knowledge.yaml`` (the shipped one by default)."""
    path = path or data_dir("compat") / "knowledge.yaml"
    doc = require_mapping(load_file(path), what="knowledge file", source=str(path))
    entries = require_mapping(doc.get("features"), what="features", source=str(path), line=doc.line)
    features = {str(name): _feature(str(name), entry, str(path)) for name, entry in entries.items()}
    for spec in features.values():
        unknown = [f for f in spec.rests_on if f not in features]
        if unknown:
            raise SpecError(f"feature {spec.name}: rests_on names unknown feature(s) {', '.join(unknown)}",
                            source=str(path), line=entries[spec.name].line_of("rests_on"))
    return FeatureCatalog(features)


def _feature(name: str, entry: object, source: str) -> FeatureSpec:
    entry = require_mapping(entry, what=f"feature {name}", source=source)
    check_keys(entry, allowed={"question", "tiers", "needs", "rests_on", "jit"}, what=f"feature {name}",
               required={"question"})
    tiers = (require_mapping(entry["tiers"], what=f"feature {name}: tiers", source=source, line=entry.line_of("tiers"))
             if "tiers" in entry else LineDict())
    parsed = []
    for tier, conclusion in tiers.items():
        try:
            parsed.append((Tier(tier), conclusion))
        except ValueError:
            raise SpecError(f"feature {name}: unknown tier {tier!r}; valid: {', '.join(t.value for t in Tier)}",
                            source=source, line=tiers.line_of(tier)) from None
        if conclusion not in CONCLUSIONS:
            raise SpecError(f"feature {name}: tier {tier} must be one of {', '.join(CONCLUSIONS)}, got {conclusion!r}",
                            source=source, line=tiers.line_of(tier))
    needs = tuple(_need(name, need, source) for need in entry.get("needs") or ())
    rests_on = entry.get("rests_on") or []
    if not isinstance(rests_on, list):
        raise SpecError(f"feature {name}: rests_on must be a list of features", source=source,
                        line=entry.line_of("rests_on"))
    jit = str(entry.get("jit") or "")
    if jit and jit not in JIT_KINDS:
        raise SpecError(f"feature {name}: jit must be one of {', '.join(JIT_KINDS)}, got {jit!r}", source=source,
                        line=entry.line_of("jit"))
    return FeatureSpec(name=name, question=" ".join(str(entry["question"]).split()), tiers=tuple(parsed),
                       needs=needs, rests_on=tuple(str(f) for f in rests_on), jit=jit)


def _need(name: str, entry: object, source: str) -> HardwareNeed:
    entry = require_mapping(entry, what=f"feature {name}: a need", source=source)
    check_keys(entry, allowed={"any", "why", "sources"}, what=f"feature {name}: a need", required={"any", "why"})
    names = tuple(str(n) for n in entry["any"]) if isinstance(entry["any"], list) else ()
    unknown = [n for n in names if n not in HARDWARE]
    if not names or unknown:
        raise SpecError(f"feature {name}: needs.any must list hardware from {', '.join(HARDWARE)}, "
                        f"got {entry['any']!r}", source=source, line=entry.line_of("any"))
    return HardwareNeed(any_of=names, why=str(entry["why"]),
                        sources=tuple({str(k): str(v) for k, v in s.items()} for s in entry.get("sources") or ()))
