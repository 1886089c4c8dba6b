"""Hypothesis strategies for DistTrainJob specs, drawn from the CRD's own `spec` schema: the unit
fuzz (tests/unit/test_fuzz.py) and the API-server fuzz (tests/chaos/test_fuzz_manifests.py)."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from disttrain.api.crd import job_schema

Schema = dict[str, Any]
SPEC_SCHEMA: Schema = job_schema()["properties"]["spec"]

# A pod template's schema is Kubernetes' whole PodTemplateSpec: drawn from it, nearly every
# template is noise the API server refuses. These are the fields that change what the operator
# builds (GPUs, CPU limits, env it must not override, scheduling, privileges).
containers = st.lists(st.fixed_dictionaries({"name": st.sampled_from(["main", "tf", "sidecar"]), "image": st.just(
    "disttrain/tensorflow:2.21")}, optional={
    "resources": st.fixed_dictionaries({}, optional={"limits": st.dictionaries(
        st.sampled_from(["cpu", "memory", "nvidia.com/gpu"]),
        st.one_of(st.sampled_from(["500m", "2", "1.5", "64", "0", "1Gi"]), st.integers(0, 16)), max_size=3)}),
    "env": st.lists(st.fixed_dictionaries({"name": st.sampled_from(["TF_CONFIG", "OMP_NUM_THREADS", "X"]),
                                           "value": st.text(max_size=5)}), max_size=2),
    "command": st.lists(st.text(max_size=8), max_size=3),
    "securityContext": st.fixed_dictionaries({}, optional={"privileged": st.booleans(),
                                                           "runAsNonRoot": st.booleans()}),
}), min_size=1, max_size=3, unique_by=lambda c: str(c["name"]))
# Valid as far as the CRD can tell (a spec, containers, unique names); the API fuzz breaks them on purpose.
templates = st.fixed_dictionaries({
    "spec": st.fixed_dictionaries({"containers": containers}, optional={
        "schedulerName": st.sampled_from(["volcano", "default-scheduler", "scheduler-plugins-scheduler"]),
        "nodeSelector": st.dictionaries(st.sampled_from(["gpu", "zone"]), st.just("a"), max_size=2),
        "hostNetwork": st.booleans(),
        "automountServiceAccountToken": st.booleans(),
    }),
}, optional={
    "metadata": st.fixed_dictionaries({}, optional={"labels": st.dictionaries(
        st.sampled_from(["app", "disttrain.dev/job-name", "team"]), st.text("abc", max_size=4), max_size=2)}),
})


def from_schema(schema: Schema) -> st.SearchStrategy[Any]:
    """Values the schema admits (CEL rules aside: the API server checks those, parse_spec must cope)."""
    if schema.get("description", "").startswith("Pod template for"):
        return templates
    kind = schema.get("type")
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if kind == "integer":
        low, high = schema.get("minimum", 0), schema.get("maximum")
        return st.integers(low, high if high is not None else max(low, 0) + 12) | st.just(low)
    if kind == "boolean":
        return st.booleans()
    if kind == "string":
        return st.text(st.characters(codec="utf-8"), max_size=12) | st.sampled_from(["volcano", "/root/.ssh"])
    assert kind == "object", schema
    properties = schema.get("properties") or {}
    required = set(schema.get("required") or ())
    return st.fixed_dictionaries({k: from_schema(v) for k, v in properties.items() if k in required},
                                 optional={k: from_schema(v) for k, v in properties.items() if k not in required})


def with_defaults(schema: Schema, value: Any) -> Any:
    """What the API server stores: each absent property with a default gets it, recursively."""
    if not isinstance(value, dict) or schema.get("type") != "object" or "Pod template" in schema.get("description",
                                                                                                        ""):
        return value
    out = dict(value)
    for key, sub in (schema.get("properties") or {}).items():
        if key not in out and "default" in sub:
            out[key] = sub["default"]
        if key in out:
            out[key] = with_defaults(sub, out[key])
    return out


def one_framework(name: str) -> st.SearchStrategy[dict[str, Any]]:
    """Most drawn specs have exactly one framework (else parse_spec refuses them all alike)."""
    props = SPEC_SCHEMA["properties"]
    return st.fixed_dictionaries({name: from_schema(props[name])}, optional={"runPolicy": from_schema(
        props["runPolicy"])})


specs = st.one_of(one_framework("tensorflow"), one_framework("tensorflow"), one_framework("mpi"),
                  from_schema(SPEC_SCHEMA)).map(lambda s: with_defaults(SPEC_SCHEMA, s))
