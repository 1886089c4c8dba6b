"""Invalid jobs fail at `kubectl apply`, with a message that names the field."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import yaml

import manifests
from manifests import mwms_job, ps_job, replica
from support import CRD_FILE, Cluster, install_crd, wait_for

Job = dict[str, Any]


def edit(base: Callable[[], Job], change: Callable[[Job], object]) -> Job:
    job = copy.deepcopy(base())
    change(job)
    return job


def tf(job: Job) -> Job:
    tensorflow: Job = job["spec"]["tensorflow"]
    return tensorflow


def mpi_job() -> Job:
    return manifests.mpi_job("hvd", workers=2, gpus=2, worker_policy="Never")


def gloo_job() -> Job:
    return manifests.gloo_job("hvd", workers=2)


CONTAINER_0 = "spec.tensorflow.worker.template.spec.containers[0]"
CONTAINER_NAMED = 'spec.tensorflow.worker.template.spec.containers[name="tensorflow"]'


def container(job: Job, rtype: str = "worker") -> dict[str, Any]:
    first: dict[str, Any] = tf(job)[rtype]["template"]["spec"]["containers"][0]
    return first


INVALID: dict[str, tuple[Job, list[str | tuple[str, ...]]]] = {
    "replicas of the wrong type": (
        edit(mwms_job, lambda j: tf(j)["worker"].update(replicas="four")),
        ["spec.tensorflow.worker.replicas"]),
    "unknown replica type": (
        edit(mwms_job, lambda j: tf(j).update(master=replica(1))),
        ["spec.tensorflow.master"]),
    "two chiefs": (
        edit(ps_job, lambda j: tf(j)["chief"].update(replicas=2)),
        ["spec.tensorflow.chief.replicas", "less than or equal to 1"]),
    "two evaluators": (
        edit(ps_job, lambda j: tf(j)["evaluator"].update(replicas=2)),
        ["spec.tensorflow.evaluator.replicas", "less than or equal to 1"]),
    "no workers and no chief": (
        edit(ps_job, lambda j: [tf(j).pop(k) for k in ("chief", "worker")]),
        ["spec.tensorflow", "at least one chief or worker"]),
    # Server-side apply names a container by its key (containers is a list-map keyed by name).
    "a typo inside a pod template": (
        edit(mwms_job, lambda j: container(j).update(imagee="tf")),
        [(f"{CONTAINER_0}.imagee", f"{CONTAINER_NAMED}.imagee")]),
    "a wrong type inside a pod template": (
        edit(mwms_job, lambda j: container(j).update(ports=[{"containerPort": "http"}])),
        [(f"{CONTAINER_0}.ports[0].containerPort", f"{CONTAINER_NAMED}.ports[0].containerPort")]),
    "a pod template with no container": (
        edit(mwms_job, lambda j: tf(j)["worker"]["template"]["spec"].update(containers=[])),
        ["spec.tensorflow.worker.template.spec.containers", "at least 1 item"]),
    "two containers of one name": (
        edit(mwms_job, lambda j: tf(j)["worker"]["template"]["spec"]["containers"].append(dict(container(j)))),
        ["spec.tensorflow.worker.template.spec.containers", ("Duplicate value", "duplicate entries")]),
    "a pod template with no spec": (
        edit(mwms_job, lambda j: tf(j)["worker"].update(template={"metadata": {"labels": {"a": "b"}}})),
        ["spec.tensorflow.worker.template.spec", "Required value"]),
    "a 60-character name": (
        edit(mwms_job, lambda j: j["metadata"].update(name="a" * 60)),
        ["metadata.name is too long", "hostname"]),
    "a name that is no DNS label": (
        edit(mwms_job, lambda j: j["metadata"].update(name="my.job")),
        ["metadata.name must be a DNS-1035 label"]),
    "negative replicas": (
        edit(mwms_job, lambda j: tf(j)["worker"].update(replicas=-1)),
        ["spec.tensorflow.worker.replicas", "greater than or equal to 0"]),
    "an unknown restart policy": (
        edit(mwms_job, lambda j: tf(j)["worker"].update(restartPolicy="Sometimes")),
        ["spec.tensorflow.worker.restartPolicy", "Unsupported value"]),
    "a replica without a template": (
        edit(mwms_job, lambda j: tf(j)["worker"].pop("template")),
        ["spec.tensorflow.worker.template", "Required value"]),
    "both tensorflow and mpi": (
        edit(mwms_job, lambda j: j["spec"].update(mpi=mpi_job()["spec"]["mpi"])),
        ["exactly one of spec.tensorflow or spec.mpi"]),
    "neither tensorflow nor mpi": (
        edit(mwms_job, lambda j: j["spec"].pop("tensorflow") and j["spec"].update(runPolicy={})),
        ["exactly one of spec.tensorflow or spec.mpi"]),
    "a port out of range": (
        edit(mwms_job, lambda j: tf(j).update(port=70000)),
        ["spec.tensorflow.port", "less than or equal to 65535"]),
    "an unknown cleanPodPolicy": (
        edit(mwms_job, lambda j: j["spec"].update(runPolicy={"cleanPodPolicy": "Some"})),
        ["spec.runPolicy.cleanPodPolicy", "Unsupported value"]),
    "a negative backoffLimit": (
        edit(mwms_job, lambda j: j["spec"].update(runPolicy={"backoffLimit": -1})),
        ["spec.runPolicy.backoffLimit", "greater than or equal to 0"]),
    "an unknown successPolicy": (
        edit(mwms_job, lambda j: tf(j).update(successPolicy="AnyWorker")),
        ["spec.tensorflow.successPolicy", "Unsupported value"]),
    "an MPI job without a launcher": (
        edit(mpi_job, lambda j: j["spec"]["mpi"].pop("launcher")),
        ["spec.mpi.launcher", "Required value"]),
    "an MPI job with two launchers": (
        edit(mpi_job, lambda j: j["spec"]["mpi"]["launcher"].update(replicas=2)),
        ["spec.mpi.launcher.replicas", "less than or equal to 1"]),
    "an MPI job with zero workers": (
        edit(mpi_job, lambda j: j["spec"]["mpi"]["worker"].update(replicas=0)),
        ["spec.mpi.worker.replicas", "greater than or equal to 1"]),
    "an unknown MPI implementation": (
        edit(mpi_job, lambda j: j["spec"]["mpi"].update(implementation="LAM")),
        ["spec.mpi.implementation", "Unsupported value"]),
    "slotsPerWorker 0": (
        edit(mpi_job, lambda j: j["spec"]["mpi"].update(slotsPerWorker=0)),
        ["spec.mpi.slotsPerWorker", "greater than or equal to 1"]),
    "an unknown bootstrap": (
        edit(gloo_job, lambda j: j["spec"]["mpi"].update(bootstrap="PMIx")),
        ["spec.mpi.bootstrap", "Unsupported value"]),
    "a Gloo job with a launcher": (
        edit(gloo_job, lambda j: j["spec"]["mpi"].update(launcher=mpi_job()["spec"]["mpi"]["launcher"])),
        ["spec.mpi.launcher", "bootstrap Gloo has no launcher: each worker runs the training command itself"]),
    "an elastic Gloo job": (
        edit(gloo_job, lambda j: j["spec"]["mpi"].update(elastic={"minReplicas": 1, "maxReplicas": 3})),
        ["spec.mpi.elastic", "elastic needs bootstrap SSH: Horovod's elastic driver"]),
    "a TensorFlow job larger than its TF_CONFIG can list": (
        edit(mwms_job, lambda j: (j["metadata"].update(name="a" * 51), tf(j)["worker"].update(replicas=1055))),
        ["spec.tensorflow: Forbidden: too many members: TF_CONFIG lists every chief, ps and worker",
         "1,054 with a 51-character name"]),
    "an MPI job larger than its hostfile's ConfigMap can list": (
        edit(mpi_job, lambda j: j["spec"]["mpi"]["worker"].update(replicas=6000)),
        ["spec.mpi.worker.replicas: Forbidden: too many workers: the hostfile and discover_hosts.sh list every one",
         "2,695 with a 51-character job name"]),
    "a Gloo worker without a command": (
        edit(gloo_job, lambda j: j["spec"]["mpi"]["worker"]["template"]["spec"]["containers"][0].pop("command")),
        ["spec.mpi.worker.template.spec.containers", "runs its own command"]),
}


@pytest.mark.parametrize("server_side", [False, True], ids=["apply", "apply-server-side"])
@pytest.mark.parametrize("case", list(INVALID))
def test_invalid_job_is_rejected_by_kubectl_apply(crd: Cluster, namespace: str, case: str, server_side: bool) -> None:
    manifest, expected = INVALID[case]
    result = crd.apply(manifest, namespace, check=False, server_side=server_side)
    assert result.returncode != 0, f"{case}: accepted"
    for text in expected:
        either = text if isinstance(text, tuple) else (text,)
        assert any(t in result.stderr for t in either), f"{case}: {text!r} not in {result.stderr!r}"
    assert not crd.kubectl("get", "dtj", "-n", namespace, "-o", "name").stdout


def test_the_largest_jobs_the_size_rules_admit_are_accepted(crd: Cluster, namespace: str) -> None:
    """The bound the rules state (api/crd_size.py), from the other side: the largest job of the longest
    name a 1,024th pod allows passes the API server's validation, TensorFlow and MPI (a server-side dry
    run: stored, an operator would make its thousand pods)."""
    from disttrain.api.crd_size import mpi_workers_fit, tf_members_fit

    tf_max = edit(mwms_job, lambda j: (j["metadata"].update(name="t" * 51),
                                       tf(j)["worker"].update(replicas=tf_members_fit(51, 1024))))
    mpi_max = edit(mpi_job, lambda j: (j["metadata"].update(name="m" * 51),
                                       j["spec"]["mpi"]["worker"].update(replicas=mpi_workers_fit(51, 2000, 4))))
    for manifest in (tf_max, mpi_max):
        result = crd.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-", input=yaml.safe_dump(manifest),
                             check=False)
        assert result.returncode == 0, result.stderr


def test_a_job_stored_before_the_size_rules_keeps_its_status_writes_and_edits(crd: Cluster, namespace: str) -> None:
    """The review of issue 45: a rule on the whole object runs on every update of it, the status
    subresource's included. An SSH job of 6,000 workers ran before the size rules (its ConfigMap fits
    in a short namespace; the rule counts a 63-character one): after the CRD's upgrade its status and
    its labels are still written. The rules are a creation's (optionalOldSelf)."""
    big = edit(mpi_job, lambda j: (j["spec"]["mpi"]["worker"].update(replicas=6000),
                                   j["spec"].setdefault("runPolicy", {}).update(suspend=True)))

    probe = edit(lambda: big, lambda j: j["metadata"].update(name="probe"))  # a creation: "hvd" is one once stored

    def refused() -> bool:
        result = crd.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-", input=yaml.safe_dump(probe),
                             check=False)
        return result.returncode != 0 and "too many workers" in result.stderr

    before = yaml.safe_load(CRD_FILE.read_text())
    rules = before["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["x-kubernetes-validations"]
    before["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["x-kubernetes-validations"] = [
        r for r in rules if "too many" not in r.get("message", "")]  # the size rules
    crd.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=yaml.safe_dump(before))
    try:
        wait_for(lambda: not refused(), 60, "the CRD without the size rules served")
        crd.apply(big, namespace)
    finally:
        install_crd(crd)
        wait_for(refused, 60, "the size rules enforced again")
    crd.custom.patch_namespaced_custom_object_status("disttrain.dev", "v1", namespace, "disttrainjobs", "hvd",
                                                     {"status": {"message": "written after the upgrade"}},
                                                     _content_type="application/merge-patch+json")
    crd.kubectl("label", "dtj", "hvd", "-n", namespace, "edited=after-the-upgrade")
    assert crd.job(namespace, "hvd")["metadata"]["labels"]["edited"] == "after-the-upgrade"


def test_replicas_cannot_change_after_creation(crd: Cluster, namespace: str) -> None:
    job = mwms_job("fixed", workers=2)
    crd.apply(job, namespace)
    tf(job)["worker"]["replicas"] = 3
    result = crd.apply(job, namespace, check=False)
    assert result.returncode != 0
    assert "the number of worker replicas can't be changed after the job is created" in result.stderr


def test_valid_jobs_are_accepted_with_defaults_filled_in(crd: Cluster, namespace: str) -> None:
    crd.apply(ps_job("ok"), namespace)
    stored = crd.job(namespace, "ok")["spec"]
    assert stored["tensorflow"]["port"] == 2222
    assert stored["tensorflow"]["successPolicy"] == "ChiefOrWorker0"
    assert stored["runPolicy"]["backoffLimit"] == 3
    assert stored["runPolicy"]["cleanPodPolicy"] == "Running"
    assert "restartScope" not in stored["runPolicy"], "its default depends on the job's shape"
    crd.apply(mpi_job(), namespace)
    assert crd.job(namespace, "hvd")["spec"]["mpi"]["launcherStart"] == "WhenWorkersReady"
    assert crd.job(namespace, "hvd")["spec"]["mpi"]["bootstrap"] == "SSH"
    crd.apply(edit(gloo_job, lambda j: j["metadata"].update(name="gloo")), namespace)
    assert crd.job(namespace, "gloo")["spec"]["mpi"]["bootstrap"] == "Gloo"


def test_kubectl_explain_teaches_the_api(crd: Cluster) -> None:
    out = crd.kubectl("explain", "disttrainjob.spec.runPolicy.restartScope").stdout
    assert "Pod: recreate only the failed pod" in out
    out = crd.kubectl("explain", "dtj.spec.tensorflow.worker").stdout
    assert "restartPolicy" in out and "template" in out


def test_printer_columns(crd: Cluster, namespace: str) -> None:
    crd.apply(yaml.safe_dump(ps_job("cols")), namespace)
    header = crd.kubectl("get", "disttrainjobs", "-n", namespace, "-o", "wide").stdout.splitlines()[0].split()
    assert header == ["NAME", "PHASE", "READY", "RESTARTS", "PROGRESS%", "ETA", "REASON", "AGE", "FRAMEWORK",
                      "WORKERS", "STARTED", "COMPLETED", "STALLED", "GPU-HOURS", "CPU-HOURS", "GOODPUT%", "METRICS",
                      "MESSAGE"]
    assert "cols" in crd.kubectl("get", "disttrain", "-n", namespace).stdout, "category disttrain"
