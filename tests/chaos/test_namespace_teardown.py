"""A namespace deleted with jobs running in it (issue 12, item 4).

Kubernetes 1.36 deletes a namespace's pods first (OrderedNamespaceDeletion), while its
DistTrainJobs still exist: an operator that takes those pods for lost ones restarts every job and
recreates its pods, each create refused with 403 (the namespace is terminating), and writes status
and events all the while, which drew out the teardown. A job whose namespace is going away must get
no new pod and no status write: counted here from the API server's own request counters."""

from __future__ import annotations

import time
import uuid

from chaos_support import delta, mpi_small, request_counts, tf_small

from support import Cluster, OperatorProcess, wait_for, wait_namespace_ready

# What the operator writes (docs/api.md, "What the operator creates"): the endpoints controller's own
# 403s on the headless Services' Endpoints are the control plane's business.
OPERATOR_RESOURCES = {"pods", "services", "configmaps", "secrets", "events", "disttrainjobs", "podgroups",
                      "workloads"}
JOBS = 30  # 24 TensorFlow jobs of 2 workers, 6 MPI jobs of 2 workers and a launcher
PODS = 66


def make_namespace(cluster: Cluster) -> str:
    name = f"chaos-ns-{uuid.uuid4().hex[:6]}"
    cluster.core.create_namespace({"metadata": {"name": name}})
    wait_namespace_ready(cluster, name)
    return name


def delete_and_time(cluster: Cluster, namespace: str, timeout: float = 180) -> float:
    start = time.monotonic()
    cluster.core.delete_namespace(namespace)

    def gone() -> bool:
        return not [n for n in cluster.core.list_namespace().items if n.metadata.name == namespace]
    wait_for(gone, timeout, f"namespace {namespace} deleted", interval=0.2)
    return time.monotonic() - start


def plain_pods(cluster: Cluster, namespace: str, count: int) -> None:
    """The same number of pods and Services, made without the operator: what the namespace
    controller alone needs to tear down."""
    for i in range(count):
        cluster.core.create_namespaced_service(namespace, {"metadata": {"name": f"svc-{i}"}, "spec": {
            "clusterIP": "None", "selector": {"app": f"a{i}"}, "ports": [{"port": 2222}]}})
    for i in range(PODS):
        cluster.core.create_namespaced_pod(namespace, {"metadata": {"name": f"pod-{i}", "labels": {"app": "a0"}},
                                                       "spec": {"containers": [{"name": "c", "image": "busybox",
                                                                                "resources": {"limits": {
                                                                                    "cpu": "100m"}}}]}})


def running_pods(cluster: Cluster, namespace: str, count: int) -> None:
    def check() -> bool:
        pods = cluster.pods(namespace)
        return len(pods) >= count and all(p.status.phase == "Running" for p in pods)
    wait_for(check, 180, f"{count} running pods in {namespace}", interval=0.5)


def test_deleting_a_namespace_of_running_jobs_makes_no_requests(cluster: Cluster, operator: OperatorProcess) -> None:
    baseline_ns = make_namespace(cluster)
    plain_pods(cluster, baseline_ns, JOBS)
    running_pods(cluster, baseline_ns, PODS)
    before = request_counts(cluster)
    baseline = delete_and_time(cluster, baseline_ns)
    time.sleep(2)
    # What the control plane's own controllers get refused in any namespace going away (the
    # root CA publisher recreating kube-root-ca.crt, the endpoints controller): not ours.
    noise = {k: v for k, v in delta(before, request_counts(cluster)).items() if k[3] == "403"}

    namespace = make_namespace(cluster)
    for i in range(JOBS):
        manifest = mpi_small(f"mpi-{i}") if i % 5 == 4 else tf_small(f"tf-{i}")
        cluster.apply(manifest, namespace)
    running_pods(cluster, namespace, PODS)
    wait_for(lambda: all((j.get("status") or {}).get("phase") == "Running" for j in cluster.custom.
                         list_namespaced_custom_object("disttrain.dev", "v1", namespace, "disttrainjobs")["items"]),
             120, "every job Running", interval=0.5)
    log_before = len(operator.log())
    before = request_counts(cluster)
    teardown = delete_and_time(cluster, namespace)
    time.sleep(2)  # a late retry of the operator's would show here
    made = delta(before, request_counts(cluster))
    refused = {k: v for k, v in made.items() if k[3] == "403" and k[1] in OPERATOR_RESOURCES
               and v > noise.get(k, 0)}
    pod_creates = sum(v for (verb, res, sub, _), v in made.items() if (verb, res, sub) == ("POST", "pods", ""))
    status_writes = sum(v for (verb, res, sub, _), v in made.items()
                        if res == "disttrainjobs" and sub == "status")
    log = operator.log()[log_before:]
    print(f"\nteardown of {JOBS} running jobs: {teardown:.1f}s; of the same pods and Services without the "
          f"operator: {baseline:.1f}s (refused there: {noise}); refused beyond that: {refused}; pod creates: "
          f"{pod_creates}; job status writes: "
          f"{status_writes}; operator log lines about Forbidden: {log.count('Forbidden')}")
    assert not refused, f"requests refused during the teardown: {refused}"
    assert pod_creates == 0 and status_writes == 0
    assert "Traceback" not in log
    assert teardown < baseline + 15, f"teardown took {teardown:.1f}s, {baseline:.1f}s without the operator"
