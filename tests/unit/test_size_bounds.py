"""How large a job may be at `kubectl apply` (api/crd_size.py, issue 45): the CRD's rules refuse a job
one pod past what its TF_CONFIG or MPI ConfigMap can hold, admit the largest that can, and that
largest, built, fits: in the longest namespace, for every name length, never fewer than 1,024 pods."""

from __future__ import annotations

import json
from typing import Any

import pytest

from disttrain.api.admission import refusals
from disttrain.api.crd_size import CONFIG_MAP_BYTES, MAX_ENV_BYTES, mpi_workers_fit, size_rules, tf_members_fit
from disttrain.api.objects import JobRef, PodKey
from disttrain.api.parse import parse_spec
from disttrain.api.spec import TensorFlowSpec
from disttrain.builders import mpi, tensorflow
from manifests import gloo_job, mpi_job, mwms_job, replica, tf_job

LONGEST_NAMESPACE = "n" * 63
# The longest name a job of 1,024 or more pods may have: its pod `<name>-worker-1023` is a hostname.
LONGEST_NAME = 63 - len("-worker-") - 4


def size_refusals(manifest: dict[str, Any]) -> list[str]:
    return [line for line in refusals(manifest) if "too many" in line]


def process_tf_config(ref: JobRef, tf: TensorFlowSpec, key: PodKey) -> str:
    """The TF_CONFIG the process gets, as the kubelet makes it: `$(DISTTRAIN_TF_CLUSTER)` expanded
    from the ConfigMap's key the variable before it names, where the job has one."""
    env = tensorflow.pod_env(ref, tf, key)
    value = env["TF_CONFIG"]
    assert isinstance(value, str)
    made = tensorflow.desired_config_map(ref, tf)
    if made is None:
        assert tensorflow.CLUSTER_ENV not in env
        return value
    assert list(env) == [tensorflow.CLUSTER_ENV, "TF_CONFIG"]  # the variable a value names comes before it
    assert env[tensorflow.CLUSTER_ENV] == {"configMapKeyRef": {"name": made["metadata"]["name"], "key": "cluster"}}
    cluster = made["data"]["cluster"]
    assert len(f"{tensorflow.CLUSTER_ENV}={cluster}".encode()) + 1 <= MAX_ENV_BYTES
    return value.replace(f"$({tensorflow.CLUSTER_ENV})", cluster)


@pytest.mark.parametrize("length", [1, 5, 20, 38, LONGEST_NAME])
def test_the_largest_tensorflow_job_admitted_has_a_tf_config_that_fits_and_one_more_is_refused(length: int) -> None:
    name = "a" * length
    most = tf_members_fit(length, 1024)
    assert most >= 1024
    most = tf_members_fit(length, most)  # its index digits, as the rule counts them
    largest = tf_job(name, chief=replica(1), ps=replica(2), worker=replica(most - 3))
    assert size_refusals(largest) == []
    too_many = tf_job(name, chief=replica(1), ps=replica(2), worker=replica(most - 2))
    [line] = size_refusals(too_many)
    assert line.startswith("spec.tensorflow: Forbidden: too many members: TF_CONFIG lists every chief, ps and worker")

    spec = parse_spec(largest["spec"])
    assert spec.tensorflow is not None
    ref = JobRef(name, LONGEST_NAMESPACE, "u")
    assert tensorflow.tf_config_too_large(ref, spec.tensorflow) is None
    for rtype, index in (("worker", most - 4), ("chief", 0), ("ps", 1)):
        value = process_tf_config(ref, spec.tensorflow, PodKey(rtype, index))
        assert len(f"TF_CONFIG={value}".encode()) + 1 <= MAX_ENV_BYTES
        config = json.loads(value)
        assert config["task"] == {"type": rtype, "index": index}
        assert len(config["cluster"]["worker"]) == most - 3
        assert config["cluster"]["worker"][-1] == f"{name}-worker-{most - 4}.{name}:2222"  # short names


def test_a_job_whose_full_names_fit_keeps_them() -> None:
    spec = parse_spec(mwms_job("mnist", workers=1000)["spec"])
    assert spec.tensorflow is not None
    value = process_tf_config(JobRef("mnist", "ml", "u"), spec.tensorflow, PodKey("worker", 7))
    config = json.loads(value)
    assert config["cluster"]["worker"][999] == "mnist-worker-999.mnist.ml.svc:2222"
    assert value == json.dumps(config, separators=(",", ":"))  # as json.dumps writes the whole


@pytest.mark.parametrize("length", [1, 20, LONGEST_NAME])
def test_the_largest_mpi_job_admitted_has_a_config_map_that_fits_and_one_more_is_refused(length: int) -> None:
    name = "a" * length
    most = mpi_workers_fit(length, mpi_workers_fit(length, 1024, 4), 4)
    assert most >= 1024
    largest = mpi_job(name, workers=most, gpus=8)
    assert size_refusals(largest) == []
    [line] = size_refusals(mpi_job(name, workers=most + 1, gpus=8))
    assert line.startswith("spec.mpi.worker.replicas: Forbidden: too many workers: the hostfile and discover_hosts.sh")

    spec = parse_spec(largest["spec"])
    assert spec.mpi is not None
    ref = JobRef(name, LONGEST_NAMESPACE, "u")
    data = mpi.desired_config_map(ref, spec.mpi, running_workers=range(most))["data"]
    assert sum(len(value.encode()) for value in data.values()) <= CONFIG_MAP_BYTES


def test_the_messages_numbers_are_the_bounds() -> None:
    [tf_rule, mpi_rule] = size_rules()
    assert f"{tf_members_fit(51, 1024):,} with a 51-character name" in tf_rule["message"]
    assert f"{tf_members_fit(5, 4000):,} with a 5-character one" in tf_rule["message"]
    assert f"{mpi_workers_fit(51, 2000, 4):,} with a 51-character job name" in mpi_rule["message"]


def test_an_elastic_jobs_bound_is_its_max_replicas_and_gloo_has_no_hostfile_to_bound() -> None:
    elastic = mpi_job("hvd", workers=2)
    elastic["spec"]["mpi"]["elastic"] = {"minReplicas": 1, "maxReplicas": 9000}
    assert size_refusals(elastic) != []
    assert size_refusals(gloo_job("hvd", workers=9000)) == []
