"""Validate a RayJob as the Kubernetes API server would, against KubeRay's own CRD schema (vendored:
tests/fixtures/kuberay/README.md says from which release).

The CRD's OpenAPI schema is structural: it lists each object's ``properties`` but (like every CRD) does not say
``additionalProperties: false``; the API server prunes an unknown field, or refuses it under strict field
validation (``kubectl apply --validate=strict``, the default of ``kubectl`` since 1.27 is a warning). We check
the strict way: :func:`strict` adds ``additionalProperties: false`` to every object schema that lists its
properties and neither preserves unknown fields (``x-kubernetes-preserve-unknown-fields``) nor states its own
``additionalProperties``. The top level also must name the CRD's group/version and kind.
"""

from __future__ import annotations

import copy
import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

SCHEMA = Path(__file__).resolve().parent / "fixtures" / "kuberay" / "rayjob-v1.schema.json"


def strict(node: Any) -> Any:
    """A copy of an OpenAPI (structural) schema that refuses fields it does not list."""
    if isinstance(node, list):
        return [strict(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {k: strict(v) if k not in ("enum", "default", "required", "example") else v for k, v in node.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


@lru_cache(maxsize=1)
def _crd() -> tuple[str, str, dict]:
    doc = json.loads(SCHEMA.read_text())
    return f"{doc['group']}/{doc['version']}", doc["kind"], strict(copy.deepcopy(doc["openAPIV3Schema"]))


def errors(obj: Any) -> list[str]:
    """Every reason the API server (strict field validation) would refuse ``obj`` as a RayJob; [] when valid."""
    import jsonschema

    api_version, kind, schema = _crd()
    out = []
    if not isinstance(obj, dict):
        return [f"not a mapping: {type(obj).__name__}"]
    if obj.get("apiVersion") != api_version:
        out.append(f"apiVersion {obj.get('apiVersion')!r} is not {api_version!r}")
    if obj.get("kind") != kind:
        out.append(f"kind {obj.get('kind')!r} is not {kind!r}")
    out += operator_errors(obj)
    validator = jsonschema.Draft4Validator(schema)  # OpenAPI v3.0 schemas are a JSON Schema draft-4 dialect
    for e in sorted(validator.iter_errors(obj), key=lambda e: list(e.absolute_path)):
        out.append(f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}")
    return out


DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def operator_errors(obj: dict) -> list[str]:
    """The checks KubeRay's operator makes beyond the schema, as v1.7.0 states them
    (ray-project/kuberay ray-operator/controllers/ray/utils/validation.go: ValidateRayJobMetadata,
    ValidateRayClusterSpec), for the fields grpo-tune writes: the name is a DNS-1035 label of at most 47 characters
    (MaxRayJobNameLength = 53 - 6), the head has a container, and each worker group without autoscaling sets
    minReplicas and maxReplicas, neither negative, min <= max."""
    out = []
    name = (obj.get("metadata") or {}).get("name", "")
    if not isinstance(name, str) or len(name) > 47:
        out.append(f"metadata/name: RayJob name should be no more than 47 characters: {name!r}")
    elif not DNS_1035.match(name) or len(name) > 63:
        out.append(f"metadata/name: RayJob name should be a valid DNS-1035 label: {name!r}")
    rcs = (obj.get("spec") or {}).get("rayClusterSpec") or {}
    head = (((rcs.get("headGroupSpec") or {}).get("template") or {}).get("spec") or {}).get("containers")
    if not head:
        out.append("headGroupSpec should have at least one container")
    autoscaling = bool(rcs.get("enableInTreeAutoscaling"))
    for g in rcs.get("workerGroupSpecs") or []:
        lo, hi = g.get("minReplicas"), g.get("maxReplicas")
        if not autoscaling and (lo is None or hi is None):
            out.append(f"worker group {g.get('groupName')} must set both minReplicas and maxReplicas")
        elif isinstance(lo, int) and isinstance(hi, int):
            if lo < 0 or hi < 0:
                out.append(f"worker group {g.get('groupName')} has negative replicas")
            elif lo > hi:
                out.append(f"worker group {g.get('groupName')} has minReplicas {lo} greater than maxReplicas {hi}")
    return out
