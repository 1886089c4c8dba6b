"""A job that doesn't run says why, from its pods: here the scheduler's own words (the image and
crash-loop cases need a real kubelet: tests/e2e/test_real_node.py)."""

from __future__ import annotations

import pytest

from manifests import replica, tf_job
from support import Cluster, job_columns, wait_for

pytestmark = pytest.mark.usefixtures("operator")


def test_an_unschedulable_pod_is_said_in_the_schedulers_words(cluster: Cluster, namespace: str) -> None:
    cluster.apply(tf_job("huge", None, chief=replica(1), worker=replica(1, gpus=64)), namespace)
    status = wait_for(lambda: (s := cluster.job_status(namespace, "huge")).get("reason") == "Unschedulable" and s, 30,
                      "the job to say its pod can't be scheduled")
    assert status["phase"] == "Pending"
    assert status["message"].startswith("pod huge-worker-0 can't be scheduled: 0/")
    assert "Insufficient nvidia.com/gpu" in status["message"]
    assert job_columns(cluster, namespace, "huge", wide=False)["REASON"] == "Unschedulable"
