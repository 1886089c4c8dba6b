"""One namespace's user against the controller's memory, on the real plane (issue 43): what a
`kubectl apply` of a huge job, or of templates it names, may cost the operator every tenant shares.

- A 5,000-worker TensorFlow job: every pod's TF_CONFIG would be 214 kB, past the 128 KiB one
  environment variable can hold. `kubectl apply` refuses it (the CRD's size rule, issue 45); before
  that the operator failed it at once, and before that the controller built all 5,000 pods in one
  pass (57 -> 1,081 MB in 20 s, twice the chart's 512 Mi limit).
- The largest TensorFlow job its name allows (3,847 members, each pod's TF_CONFIG 128 KiB) and a
  5,000-worker Gloo job, in a namespace whose ResourceQuota allows 10 pods: 10 pods between them,
  the quota in their status in the API server's words, a few creates a pass.
- Three MPI jobs each naming 31 ResourceClaimTemplates of 1 MB (32 requests x 3 CEL selectors of
  10 KiB) and one template that doesn't exist: each waits in WaitingForClaims, and the controller
  keeps counts, not the specs (before: 57 -> 179 MB in 10 s).
- Meanwhile another namespace's job starts, and the controller's RSS stays within 48 MiB of where
  it was.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from disttrain.api.crd_size import tf_members_fit
from fakedra import FAKE_GPU_CLASS
from manifests import gloo_job, mpi_job, mwms_job
from progress_support import rss_mib
from support import Cluster, OperatorProcess, fresh_namespace, wait_for, wait_pods_running

pytestmark = pytest.mark.usefixtures("operator")
GROWTH_MIB = 48


@pytest.fixture
def other_namespace(cluster: Cluster) -> Iterator[str]:
    with fresh_namespace(cluster) as name:
        yield name


def huge_template(name: str) -> dict[str, Any]:
    selector = {"cel": {"expression": 'device.driver == "' + "z" * 10_200 + '"'}}
    requests = [{"name": f"r{i}", "exactly": {"deviceClassName": FAKE_GPU_CLASS, "selectors": [selector] * 3}}
                for i in range(32)]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": name},
            "spec": {"spec": {"devices": {"requests": requests}}}}


def waiting_on_claims(name: str) -> dict[str, Any]:
    job = mpi_job(name, workers=2, gpus=0)
    worker = job["spec"]["mpi"]["worker"]["template"]["spec"]
    worker["resourceClaims"] = [{"name": f"c{i}", "resourceClaimTemplateName": f"huge-{i}"} for i in range(31)]
    worker["resourceClaims"].append({"name": "missing", "resourceClaimTemplateName": "not-there"})
    worker["containers"][0].setdefault("resources", {})["claims"] = [{"name": "c0"}]
    return job


def test_huge_jobs_and_the_templates_they_name_leave_the_controllers_memory_flat(
        cluster: Cluster, operator: OperatorProcess, namespace: str, other_namespace: str) -> None:
    assert operator.proc is not None
    controller = operator.proc.pid
    cluster.kubectl("create", "-n", namespace, "-f", "-", input="\n".join(
        json.dumps(huge_template(f"huge-{i}")) for i in range(31)))
    cluster.core.create_namespaced_resource_quota(namespace, {"metadata": {"name": "ten-pods"},
                                                              "spec": {"hard": {"pods": "10"}}})
    before = rss_mib(controller)
    started = time.monotonic()
    refused = cluster.apply(mwms_job("tf-5000", workers=5000), namespace, check=False)
    assert refused.returncode != 0 and "spec.tensorflow: Forbidden: too many members: TF_CONFIG" in refused.stderr
    cluster.apply(mwms_job("tf-max", workers=tf_members_fit(len("tf-max"), 5000)), namespace)
    cluster.apply(gloo_job("gloo-5000", workers=5000), namespace)
    for i in range(3):
        cluster.apply(waiting_on_claims(f"claims-{i}"), namespace)
    cluster.apply(mwms_job("neighbour", workers=2), other_namespace)

    wait_pods_running(cluster, other_namespace, "neighbour", 2, timeout=60)
    neighbour_running = time.monotonic() - started

    def quota_said(job: str) -> dict[str, Any] | None:
        status = cluster.job_status(namespace, job)
        return status if "exceeded quota: ten-pods" in str(status.get("message")) else None

    for job in ("gloo-5000", "tf-max"):
        status = wait_for(functools.partial(quota_said, job), 60, f"{job}'s status to say the quota")
        assert status["reason"] == "PodCreateRefused", status
    def all_waiting_for_claims() -> bool:
        return all(cluster.job_status(namespace, f"claims-{i}").get("reason") == "WaitingForClaims" for i in range(3))

    wait_for(all_waiting_for_claims, 60, "the three claim jobs waiting for their missing template")
    time.sleep(10)  # a few more passes of each
    after = rss_mib(controller)
    print(f"\ncontroller RSS {before:.0f} -> {after:.0f} MiB; the other namespace's job Running "
          f"{neighbour_running:.1f} s after the huge ones were applied")
    assert after - before < GROWTH_MIB
    assert len(cluster.pods(namespace, "disttrain.dev/job-name in (gloo-5000,tf-max)")) == 10
    assert operator.proc.poll() is None, "the operator is still running"
