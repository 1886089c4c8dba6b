"""The client's job classes against the CRD's own openAPIV3Schema: every field is a property of
the same type and every property of ours a field (so they can't drift apart), and the jobs they
build are valid under the schema, pod templates included."""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from typing import Any

import pytest

from disttrain.api.crd import crd
from disttrain.builders.render import render_objects
from disttrain.client import (
    MPI,
    CleanPodPolicy,
    Container,
    Gang,
    GangProvider,
    Job,
    LauncherStart,
    MPIImplementation,
    Replica,
    RestartPolicy,
    RestartScope,
    RunPolicy,
    Scheduling,
    Spec,
    SuccessPolicy,
    TensorFlow,
)
from disttrain.client.jobs import NOT_IN_SCHEMA, camel

SCHEMA: dict[str, Any] = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
JSON_TYPES = {int: "integer", str: "string", bool: "boolean", dict: "object"}


def field_type(cls: type, name: str) -> type:
    """A field's type without its `| None`."""
    hint = typing.get_type_hints(cls)[name]
    args = [a for a in typing.get_args(hint) if a is not type(None)] if isinstance(hint, types.UnionType) else [hint]
    assert len(args) == 1, f"{cls.__name__}.{name}: one type, or it plus None"
    found: type = typing.get_origin(args[0]) or args[0]
    return found


def check_against_schema(cls: type, schema: dict[str, Any], path: str) -> None:
    fields = {camel(f.name): f for f in dataclasses.fields(cls) if f.name not in NOT_IN_SCHEMA}
    properties = schema["properties"]
    assert set(fields) == set(properties), f"{path}: fields and schema differ"
    for name, f in fields.items():
        prop, kind = properties[name], field_type(cls, f.name)
        if name in schema.get("required", []) and name != "template":  # a Replica's container makes one
            assert f.default is dataclasses.MISSING, f"{path}.{name} is required: no default"
        if dataclasses.is_dataclass(kind):
            check_against_schema(kind, prop, f"{path}.{name}")
        elif issubclass(kind, enum.Enum):
            assert prop["enum"] == [e.value for e in kind], f"{path}.{name}"
        else:
            assert prop["type"] == JSON_TYPES[kind], f"{path}.{name}"


def test_job_classes_are_the_crds_spec() -> None:
    check_against_schema(Spec, SCHEMA["properties"]["spec"], "spec")


def errors(value: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """The structural schema's own checks (types, enums, bounds, required and unknown fields;
    not CEL: the API server runs those in the integration test)."""
    if "anyOf" in schema:
        return [] if any(not errors(value, s, path) for s in schema["anyOf"]) else [f"{path}: no anyOf matches"]
    if schema.get("x-kubernetes-int-or-string"):
        return [] if isinstance(value, int | str) else [f"{path}: not int or string"]
    kind = schema.get("type")
    python = {"object": dict, "array": list, "string": str, "integer": int, "boolean": bool, "number": int | float}
    if (kind and not isinstance(value, python[kind])) or (kind == "integer" and isinstance(value, bool)):
        return [f"{path}: {value!r} is not {kind}"]
    found = [f"{path}: {value!r} not in {schema['enum']}"] if "enum" in schema and value not in schema["enum"] else []
    if ("minimum" in schema and value < schema["minimum"]) or ("maximum" in schema and value > schema["maximum"]):
        found.append(f"{path}: {value} out of bounds")
    if kind == "array":
        found += [e for i, item in enumerate(value) for e in errors(item, schema.get("items", {}), f"{path}[{i}]")]
    if kind == "object":
        found += [f"{path}.{r}: required" for r in schema.get("required", []) if r not in value]
        props, extra = schema.get("properties", {}), schema.get("additionalProperties")
        for key, item in value.items():
            if key in props:
                found += errors(item, props[key], f"{path}.{key}")
            elif isinstance(extra, dict):
                found += errors(item, extra, f"{path}.{key}")
            elif props and not schema.get("x-kubernetes-preserve-unknown-fields"):
                found.append(f"{path}.{key}: unknown field")
    return found


def tf_job() -> Job:
    worker = Container("disttrain/tensorflow:2.21", command=["python", "/train.py"], env={"EPOCHS": "3"}, cpu=2,
                       memory="4Gi", gpus=1)
    return Job("mnist", Spec(
        tensorflow=TensorFlow(chief=Replica(replicas=1, container=worker),
                              ps=Replica(replicas=2, restart_policy=RestartPolicy.ON_FAILURE, container=worker),
                              worker=Replica(replicas=4, restart_policy=RestartPolicy.EXIT_CODE, container=worker),
                              evaluator=Replica(replicas=1, template={"spec": {"containers": [
                                  {"name": "eval", "image": "disttrain/tensorflow:2.21"}]}}),
                              port=2222, success_policy=SuccessPolicy.ALL_WORKERS),
        run_policy=RunPolicy(backoff_limit=2, restart_scope=RestartScope.POD, active_deadline_seconds=3600,
                             ttl_seconds_after_finished=60, clean_pod_policy=CleanPodPolicy.ALL, suspend=False,
                             scheduling=Scheduling(scheduler_name="volcano", priority_class_name="high",
                                                   gang=Gang(GangProvider.VOLCANO, 8, 30), queue="ml"))),
        labels={"team": "vision"})


def mpi_job() -> Job:
    image = "disttrain/horovod:0.28.1"
    return Job("hvd", Spec(mpi=MPI(launcher=Replica(container=Container(image, command=["mpirun", "python", "t.py"]),
                                                    restart_policy=RestartPolicy.NEVER),
                                   worker=Replica(replicas=2, container=Container(image, gpus=2)),
                                   implementation=MPIImplementation.OPENMPI, slots_per_worker=2,
                                   ssh_auth_mount_path="/root/.ssh", launcher_start=LauncherStart.IMMEDIATELY)))


@pytest.mark.parametrize("job", [tf_job(), mpi_job(), Job("tiny", Spec(tensorflow=TensorFlow(
    worker=Replica(container=Container("busybox")))))], ids=["tensorflow", "mpi", "tiny"])
def test_built_jobs_are_valid_under_the_crd_schema(job: Job) -> None:
    manifest = job.to_manifest("ns")
    assert errors(manifest["spec"], SCHEMA["properties"]["spec"], "spec") == []
    assert render_objects(manifest)  # and the operator's own builders take it


def test_the_schema_check_catches_what_it_should() -> None:
    spec = tf_job().to_manifest()["spec"]
    spec["tensorflow"]["worker"]["restartPolicy"] = "Sometimes"
    spec["tensorflow"]["chief"]["replicas"] = 2
    spec["runPolicy"]["backofLimit"] = 3
    spec["tensorflow"]["ps"]["template"]["spec"]["containers"][0]["imagePullPolicy"] = 3
    found = errors(spec, SCHEMA["properties"]["spec"], "spec")
    assert len(found) == 4, found


def test_manifest_shape() -> None:
    manifest = tf_job().to_manifest("team-a")
    assert manifest["metadata"] == {"name": "mnist", "namespace": "team-a", "labels": {"team": "vision"}}
    worker = manifest["spec"]["tensorflow"]["worker"]
    assert worker["restartPolicy"] == "ExitCode" and worker["replicas"] == 4
    assert worker["template"]["spec"]["containers"][0]["resources"] == {
        "limits": {"cpu": 2, "memory": "4Gi", "nvidia.com/gpu": 1}, "requests": {"cpu": 2, "memory": "4Gi"}}
    assert manifest["spec"]["runPolicy"]["scheduling"]["gang"] == {"provider": "Volcano", "minAvailable": 8,
                                                                    "timeoutSeconds": 30}
    assert "suspend" in manifest["spec"]["runPolicy"]  # False is set, not left out
    assert Job("g", Spec(tensorflow=TensorFlow(worker=Replica(container=Container("x"))),
                         run_policy=RunPolicy(scheduling=Scheduling(gang=Gang()))
                         )).to_manifest()["spec"]["runPolicy"] == {"scheduling": {"gang": {}}}  # {} turns gangs on


def test_mistakes_the_types_cant_catch_are_refused() -> None:
    with pytest.raises(ValueError, match="template or a container"):
        Replica(replicas=1).to_dict()
    with pytest.raises(ValueError, match=r"spec\.tensorflow or spec\.mpi"):
        Job("none", Spec()).to_manifest()
