"""The pod watch's decoder (watch/pod_events.py) reads only a subset of a pod: whatever the subset
is, `observe_pod` must see the same pod through it as through the whole JSON."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from disttrain.api.observed import observe_pod
from disttrain.watch.pod_events import decode_event, decode_list

TIME = "2026-11-25T02:54:01Z"
text = st.sampled_from(["", "Error", "OOMKilled", "Evicted", "ImagePullBackOff", "CrashLoopBackOff", "x" * 40])
maybe = st.one_of(st.none(), text)


def terminated() -> Any:
    return st.fixed_dictionaries({"exitCode": st.integers(0, 255)},
                                 optional={"reason": text, "finishedAt": st.just(TIME), "signal": st.just(9)})


def container_state() -> Any:
    return st.fixed_dictionaries({}, optional={
        "terminated": terminated(),
        "waiting": st.fixed_dictionaries({}, optional={"reason": text, "message": text}),
        "running": st.just({"startedAt": TIME})})


container_status = st.fixed_dictionaries(
    {"name": st.sampled_from(["tf", "sidecar", "fetch"]), "restartCount": st.integers(0, 5)},
    optional={"image": st.just("tf:2.21"), "state": container_state(), "lastState": container_state(),
              "ready": st.booleans(), "imageID": st.just("sha256:00")})
condition = st.fixed_dictionaries(
    {"type": st.sampled_from(["Ready", "PodScheduled", "DisruptionTarget", "Initialized"]),
     "status": st.sampled_from(["True", "False"])},
    optional={"reason": text, "message": text, "lastTransitionTime": st.just(TIME), "lastProbeTime": st.none()})
status = st.fixed_dictionaries({}, optional={
    "phase": st.sampled_from(["Pending", "Running", "Succeeded", "Failed", "Unknown"]), "reason": maybe,
    "conditions": st.lists(condition, max_size=4), "containerStatuses": st.lists(container_status, max_size=2),
    "initContainerStatuses": st.lists(container_status, max_size=2), "podIP": st.just("10.0.0.1"),
    "qosClass": st.just("BestEffort")})


def pod_with(status: dict[str, Any], deleting: bool, node: str | None, index: str) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": "mnist-worker-1", "namespace": "ml", "uid": "pod-uid", "resourceVersion": "42",
        "labels": {"disttrain.dev/job-name": "mnist", "disttrain.dev/replica-type": "worker",
                   "disttrain.dev/replica-index": index},
        "ownerReferences": [{"apiVersion": "disttrain.dev/v1", "kind": "DistTrainJob", "name": "mnist",
                             "uid": "job-uid", "controller": True, "blockOwnerDeletion": True}],
        "managedFields": [{"manager": "disttrain", "operation": "Update", "fieldsV1": {"f:spec": {}}}],
        **({"deletionTimestamp": TIME, "deletionGracePeriodSeconds": 30} if deleting else {})}
    container = {"name": "tf", "image": "tf", "env": [{"name": "TF_CONFIG", "value": "{}"}]}
    spec: dict[str, Any] = {"containers": [container], "tolerations": [{"key": "k", "operator": "Exists"}],
                            **({"nodeName": node} if node else {})}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": status}


@settings(max_examples=300, deadline=None)
@given(status, st.booleans(), st.one_of(st.none(), st.just("kwok-node-1")), st.sampled_from(["0", "3", "x"]))
def test_a_pod_is_observed_the_same_through_the_subset(status: dict[str, Any], deleting: bool, node: str | None,
                                                       index: str) -> None:
    pod = pod_with(status, deleting, node, index)
    kind, subset = decode_event(json.dumps({"type": "MODIFIED", "object": pod}).encode())
    assert kind == "MODIFIED"
    assert observe_pod(subset) == observe_pod(pod)


def test_a_watch_error_is_the_status_whole() -> None:
    line = json.dumps({"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired",
                                                    "message": "too old resource version: 1 (2)"}}).encode()
    assert decode_event(line) == ("ERROR", {"kind": "Status", "code": 410, "reason": "Expired",
                                            "message": "too old resource version: 1 (2)"})


def test_a_bookmark_carries_its_version() -> None:
    line = json.dumps({"type": "BOOKMARK", "object": {"kind": "Pod", "apiVersion": "v1", "metadata": {
        "resourceVersion": "77", "annotations": {"k8s.io/initial-events-end": "true"}}}}).encode()
    assert decode_event(line) == ("BOOKMARK", {"metadata": {"resourceVersion": "77"}})


def test_a_list_page_gives_its_pods_version_and_continue_token() -> None:
    pod = pod_with({"phase": "Running"}, False, "n", "1")
    page = json.dumps({"kind": "PodList", "metadata": {"resourceVersion": "9", "continue": "abc"},
                       "items": [pod, pod]}).encode()
    pods, version, more = decode_list(page)
    assert (len(pods), version, more) == (2, "9", "abc")
    assert observe_pod(pods[0]) == observe_pod(pod)
    assert decode_list(b'{"metadata":{"resourceVersion":"10"},"items":null}') == ([], "10", "")
