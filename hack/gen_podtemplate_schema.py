"""Extract the PodTemplateSpec schema from a live API server's OpenAPI v3, for the CRD.

    python hack/gen_podtemplate_schema.py [--kubeconfig K] [--check]

Reads /openapi/v3/api/v1, inlines every $ref under io.k8s.api.core.v1.PodTemplateSpec and turns
the result into a structural schema a CRD accepts: descriptions dropped (docs/api.md: the schema
appears six times, ~290 KB each with them), int-or-string and quantities marked
x-kubernetes-int-or-string, defaults and list-merge hints dropped (the pod's own API server
applies them when the operator creates the pod). Writes operator/disttrain/api/schema/podtemplatespec.json;
`--check` exits 1 if that file differs from what the server says.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
OUTPUT = REPO / "operator" / "disttrain" / "api" / "schema" / "podtemplatespec.json"
ROOT = "io.k8s.api.core.v1.PodTemplateSpec"
INT_OR_STRING = {"io.k8s.apimachinery.pkg.util.intstr.IntOrString", "io.k8s.apimachinery.pkg.api.resource.Quantity"}
# Keys of an OpenAPI schema that a CRD's structural schema may carry.
KEPT_KEYS = {"type", "format", "properties", "items", "additionalProperties", "required", "enum",
             "minimum", "maximum", "minLength", "maxLength", "pattern", "minItems", "maxItems", "nullable"}
# Embedded ObjectMeta: a CRD validates only these, and prunes nothing a pod template needs.
TEMPLATE_METADATA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
        "name": {"type": "string"},
        "namespace": {"type": "string"},
    },
}


def fetch_openapi(kubeconfig: str | None) -> dict[str, Any]:
    built = REPO / ".cache" / "bin" / "kubectl"
    kubectl = os.environ.get("KUBECTL") or (str(built) if built.exists() else shutil.which("kubectl") or "kubectl")
    env = {**os.environ, **({"KUBECONFIG": kubeconfig} if kubeconfig else {})}
    raw = subprocess.run([kubectl, "get", "--raw", "/openapi/v3/api/v1"], check=True, capture_output=True,
                         env=env).stdout
    data: dict[str, Any] = json.loads(raw)
    return data


def structural(schemas: dict[str, Any], name: str, stack: tuple[str, ...] = ()) -> dict[str, Any]:
    if name in INT_OR_STRING:
        return {"x-kubernetes-int-or-string": True, "anyOf": [{"type": "integer"}, {"type": "string"}]}
    if name == "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta":
        return copy.deepcopy(TEMPLATE_METADATA)
    if name in stack:
        raise ValueError(f"recursive schema {' -> '.join((*stack, name))}")
    return convert(schemas, schemas[name], (*stack, name))


def convert(schemas: dict[str, Any], node: dict[str, Any], stack: tuple[str, ...]) -> dict[str, Any]:
    ref = node.get("$ref") or (len(node.get("allOf", [])) == 1 and node["allOf"][0].get("$ref"))
    if ref:
        return structural(schemas, ref.rsplit("/", 1)[-1], stack)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key not in KEPT_KEYS:
            continue
        if key == "properties":
            out[key] = {k: convert(schemas, v, stack) for k, v in sorted(value.items())}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = convert(schemas, value, stack)
        elif key == "required":
            out[key] = sorted(value)
        else:
            out[key] = value
    if "properties" in out or "additionalProperties" in out:
        out.setdefault("type", "object")
    return out


def extract(openapi: dict[str, Any]) -> dict[str, Any]:
    schemas = openapi["components"]["schemas"]
    return structural(schemas, ROOT)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kubeconfig", default=None)
    parser.add_argument("--check", action="store_true", help="compare with the committed file, write nothing")
    args = parser.parse_args(argv)
    text = json.dumps(extract(fetch_openapi(args.kubeconfig)), indent=1, sort_keys=True) + "\n"
    if args.check:
        if OUTPUT.read_text() != text:
            print(f"{OUTPUT} differs from the API server's PodTemplateSpec: run make crd", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text)
    print(f"wrote {OUTPUT} ({len(text)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
