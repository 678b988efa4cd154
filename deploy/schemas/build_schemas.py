"""Rebuild the vendored JSON schemas in this directory from their upstream sources.

CI never runs this (it cannot reach the network); it documents, and reproduces, how each
vendored file was made. Every output has its ``description`` strings stripped (size) and a
``$comment`` naming its source. See README.md here for versions and checksums.

    python deploy/schemas/build_schemas.py \
        --compose  compose-spec/schema/compose-spec.json \
        --lws-crd  lws/config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml \
        --k8s-dir  kubernetes_validate/kubernetes-json-schema/v1.33.0-local-strict \
        --ecs      botocore/data/ecs/2014-11-13/service-2.json.gz
"""

from __future__ import annotations

import argparse
import copy
import gzip
import json
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent


def strip_descriptions(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: strip_descriptions(v) for k, v in node.items()
                if not (k == "description" and isinstance(v, str))}
    if isinstance(node, list):
        return [strip_descriptions(v) for v in node]
    return node


def strict(node: Any) -> Any:
    """kubeconform-style strictness: objects with known properties reject unknown keys."""
    if isinstance(node, dict):
        out = {k: strict(v) for k, v in node.items()}
        if ("properties" in out and "additionalProperties" not in out
                and not out.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
        return out
    if isinstance(node, list):
        return [strict(v) for v in node]
    return node


def lws_schema(crd_path: Path) -> dict[str, Any]:
    crd = yaml.safe_load(crd_path.read_text())
    group = crd["spec"]["group"]
    (version,) = [v for v in crd["spec"]["versions"] if v.get("storage")]
    schema = strict(strip_descriptions(version["schema"]["openAPIV3Schema"]))
    schema["properties"]["apiVersion"] = {"type": "string", "enum": [f"{group}/{version['name']}"]}
    schema["properties"]["kind"] = {"type": "string", "enum": [crd["spec"]["names"]["kind"]]}
    schema["properties"]["metadata"] = {"type": "object"}
    schema["required"] = ["apiVersion", "kind", "metadata", "spec"]
    # leaderTemplate and workerTemplate are the same PodTemplateSpec: keep one copy.
    lwt = schema["properties"]["spec"]["properties"]["leaderWorkerTemplate"]["properties"]
    definitions = {}
    if lwt["leaderTemplate"] == lwt["workerTemplate"]:
        definitions["podTemplateSpec"] = lwt["workerTemplate"]
        lwt["leaderTemplate"] = lwt["workerTemplate"] = {"$ref": "#/definitions/podTemplateSpec"}
    return {"$schema": "http://json-schema.org/draft-07/schema#", **schema,
            "definitions": definitions}


def k8s_standalone(k8s_dir: Path, name: str) -> dict[str, Any]:
    """Inline the ``_definitions.json`` references of one kubernetes-json-schema file."""
    raw_defs = json.loads((k8s_dir / "_definitions.json").read_text())
    defs = raw_defs.get("$defs") or raw_defs["definitions"]
    root = json.loads((k8s_dir / name).read_text())

    def resolve(node: Any, seen: tuple[str, ...]) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str):
                key = ref.split("/")[-1]
                if key in seen:
                    raise ValueError(f"recursive reference {key}")
                return resolve(copy.deepcopy(defs[key]), (*seen, key))
            return {k: resolve(v, seen) for k, v in node.items()}
        if isinstance(node, list):
            return [resolve(v, seen) for v in node]
        return node

    out = strip_descriptions(resolve(root, ()))
    out.pop("$schema", None)
    out["required"] = sorted({*out.get("required", []), "apiVersion", "kind", "metadata"})
    return {"$schema": "http://json-schema.org/draft-07/schema#", **out}


def ecs_task_definition(service_json: Path) -> dict[str, Any]:
    """JSON schema for ``aws ecs register-task-definition --cli-input-json`` input,
    from botocore's ECS service model (structures -> closed objects, enums, required)."""
    raw = service_json.read_bytes()
    model = json.loads(gzip.decompress(raw) if service_json.suffix == ".gz" else raw)
    shapes = model["shapes"]
    defs: dict[str, Any] = {}

    def ref(name: str) -> dict[str, Any]:
        if name not in defs:
            defs[name] = {}
            defs[name] = convert(shapes[name])
        return {"$ref": f"#/definitions/{name}"}

    def convert(shape: dict[str, Any]) -> dict[str, Any]:
        t = shape["type"]
        if t == "structure":
            return {"type": "object", "additionalProperties": False,
                    "properties": {k: ref(v["shape"]) for k, v in shape["members"].items()},
                    **({"required": shape["required"]} if shape.get("required") else {})}
        if t == "list":
            return {"type": "array", "items": ref(shape["member"]["shape"])}
        if t == "map":
            return {"type": "object", "additionalProperties": ref(shape["value"]["shape"])}
        if t == "string":
            return {"type": "string", **({"enum": shape["enum"]} if "enum" in shape else {})}
        if t in ("integer", "long"):
            return {"type": "integer"}
        if t in ("float", "double"):
            return {"type": "number"}
        if t == "boolean":
            return {"type": "boolean"}
        if t == "timestamp":
            return {"type": ["string", "number"]}
        raise ValueError(f"unhandled shape type {t}")

    root = convert(shapes["RegisterTaskDefinitionRequest"])
    return {"$schema": "http://json-schema.org/draft-07/schema#", **root,
            "definitions": dict(sorted(defs.items()))}


def write(name: str, schema: dict[str, Any], source: str) -> None:
    schema = {"$comment": f"generated by build_schemas.py from {source}", **schema}
    # compact, one line: these are machine-read files (see README.md for provenance).
    (HERE / name).write_text(json.dumps(schema, separators=(",", ":")) + "\n")
    print(f"wrote {name} ({(HERE / name).stat().st_size} bytes)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--compose", type=Path)
    ap.add_argument("--lws-crd", type=Path)
    ap.add_argument("--k8s-dir", type=Path)
    ap.add_argument("--ecs", type=Path)
    a = ap.parse_args()
    if a.compose:  # vendored verbatim (apart from descriptions)
        write("compose-spec.json", strip_descriptions(json.loads(a.compose.read_text())),
              "compose-spec/compose-spec schema/compose-spec.json")
    if a.lws_crd:
        write("leaderworkerset-v1.json", lws_schema(a.lws_crd),
              "kubernetes-sigs/lws config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml")
    if a.k8s_dir:
        write("service-v1.json", k8s_standalone(a.k8s_dir, "service-v1.json"),
              f"kubernetes-validate {a.k8s_dir.name}/service-v1.json")
    if a.ecs:
        write("ecs-task-definition.json", ecs_task_definition(a.ecs),
              "botocore data/ecs/2014-11-13/service-2.json (RegisterTaskDefinitionRequest)")


if __name__ == "__main__":
    main()
