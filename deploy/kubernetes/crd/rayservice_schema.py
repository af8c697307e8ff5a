"""KubeRay's RayService CRD (vendored: ray.io_rayservices.yaml) -> a JSON Schema for check-jsonschema.

The CRD's ``openAPIV3Schema`` of the served storage version (``ray.io/v1``) is the schema the API
server validates a RayService with. Made strict the way ``kubectl apply --validate=strict`` is: an
object schema that lists its properties rejects others (additionalProperties: false) unless the
CRD says x-kubernetes-preserve-unknown-fields; ``apiVersion`` and ``kind`` are pinned.

Usage: python rayservice_schema.py > rayservice.schema.json   (scripts/check-deploy.sh runs it)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

CRD = Path(__file__).resolve().parent / "ray.io_rayservices.yaml"


def strict(node: Any) -> Any:
    if isinstance(node, dict):
        out = {k: strict(v) for k, v in node.items() if not k.startswith("x-kubernetes-")}
        preserve = node.get("x-kubernetes-preserve-unknown-fields")
        if "properties" in node and "additionalProperties" not in node and not preserve:
            out["additionalProperties"] = False
        if node.get("x-kubernetes-int-or-string"):
            out.pop("type", None)
            out.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
        return out
    if isinstance(node, list):
        return [strict(v) for v in node]
    return node


def schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD.read_text())
    version = next(v for v in crd["spec"]["versions"] if v.get("storage"))
    s = strict(version["schema"]["openAPIV3Schema"])
    s["properties"]["apiVersion"] = {"const": f"{crd['spec']['group']}/{version['name']}"}
    s["properties"]["kind"] = {"const": crd["spec"]["names"]["kind"]}
    s["properties"]["metadata"] = {"type": "object", "required": ["name"]}
    s["required"] = sorted({*s.get("required", []), "apiVersion", "kind", "metadata", "spec"})
    s["$schema"] = "http://json-schema.org/draft-07/schema#"
    return s


if __name__ == "__main__":
    json.dump(schema(), sys.stdout)
