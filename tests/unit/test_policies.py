"""Each policy on its own: success, failure, startup, deadline, TTL and cleanup."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from disttrain.api.objects import PodKey
from disttrain.api.observed import ObservedPod
from disttrain.api.parse import parse_spec
from disttrain.api.spec import CleanPodPolicy, JobSpec, RestartPolicy
from disttrain.decide.policies import cleanup, deadline, failure, startup, success, ttl
from disttrain.decide.reasons import Reason
from manifests import mpi_job, replica, tf_job

NOW = datetime.datetime(2026, 11, 22, 12, 0, 0, tzinfo=datetime.UTC)


def spec_of(job: dict[str, Any]) -> JobSpec:
    return parse_spec(job["spec"])


def pod(rtype: str, index: int, phase: str = "Running", exit_code: int | None = None, ready: bool = True,
        terminating: bool = False) -> ObservedPod:
    return ObservedPod(name=f"j-{rtype}-{index}", uid=f"u-{rtype}-{index}", owner_uid="uid-1", replica_type=rtype,
                       index=index, phase=phase, ready=ready, terminating=terminating, exit_code=exit_code,
                       reason=None, container_restarts=0)


class TestSuccess:
    def test_the_chief_decides_when_there_is_one(self) -> None:
        spec = spec_of(tf_job(chief=replica(1), worker=replica(2)))
        assert success.success_message(spec, [pod("worker", 0, "Succeeded")]) is None
        assert success.success_message(spec, [pod("chief", 0, "Succeeded")]) == "the chief succeeded"

    def test_all_workers_waits_for_every_worker(self) -> None:
        job = tf_job(worker=replica(2))
        job["spec"]["tensorflow"]["successPolicy"] = "AllWorkers"
        spec = spec_of(job)
        assert success.success_message(spec, [pod("worker", 0, "Succeeded"), pod("worker", 1)]) is None
        done = [pod("worker", 0, "Succeeded"), pod("worker", 1, "Succeeded")]
        assert success.success_message(spec, done) == "all 2 workers succeeded"

    def test_a_terminating_pod_decides_nothing(self) -> None:
        spec = spec_of(tf_job(worker=replica(2)))
        assert success.success_message(spec, [pod("worker", 0, "Succeeded", terminating=True)]) is None

    def test_mpi_launcher_decides(self) -> None:
        spec = spec_of(mpi_job("j", workers=2))
        assert success.success_message(spec, [pod("launcher", 0, "Succeeded")]) == "the launcher succeeded"
        assert success.success_message(spec, [pod("worker", 0, "Succeeded")]) is None


class TestFailure:
    @pytest.mark.parametrize(("policy", "code", "retry"), [
        (RestartPolicy.NEVER, 137, False), (RestartPolicy.EXIT_CODE, 137, True), (RestartPolicy.EXIT_CODE, 1, False),
        (RestartPolicy.EXIT_CODE, None, True), (RestartPolicy.ON_FAILURE, 1, True), (RestartPolicy.ALWAYS, 2, True)])
    def test_is_retryable(self, policy: RestartPolicy, code: int | None, retry: bool) -> None:
        assert failure.is_retryable(policy, code) is retry

    def test_fatal_failure_names_the_pod_and_the_rule(self) -> None:
        spec = spec_of(tf_job(worker=replica(2, "ExitCode")))
        assert failure.fatal_failure(spec, [pod("worker", 1, "Failed", exit_code=137)]) is None
        assert failure.fatal_failure(spec, [pod("worker", 1, "Failed", exit_code=2)]) == (
            "worker 1 (pod j-worker-1) exited with code 2; restartPolicy ExitCode does not retry exit codes 1-127")

    def test_restart_counts_one_per_whole_job_restart_and_one_per_pod_otherwise(self) -> None:
        job_scope = spec_of(tf_job(worker=replica(3)))
        decision = failure.restart(job_scope, 0, 0, [pod("worker", 0, "Failed", 137), pod("worker", 1, "Failed", 137)],
                                   [])
        assert decision is not None and decision.whole_job and decision.restarts == 1
        pod_scope = spec_of(tf_job(ps=replica(1), worker=replica(3)))
        decision = failure.restart(pod_scope, 0, 0, [pod("worker", 0, "Failed", 137)], ["j-worker-2"])
        assert decision is not None and not decision.whole_job and decision.restarts == 2
        assert decision.reason is Reason.POD_FAILED

    def test_restart_gives_up_past_the_backoff_limit(self) -> None:
        spec = spec_of(tf_job("j", {"backoffLimit": 2}, worker=replica(2)))
        decision = failure.restart(spec, 1, 1, [], ["j-worker-1"])
        assert decision is not None and decision.give_up and decision.reason is Reason.BACKOFF_LIMIT_EXCEEDED
        assert decision.message == ("pod j-worker-1 was deleted, and the job has used all 2 restarts of "
                                    "runPolicy.backoffLimit")
        assert failure.restart(spec, 0, 0, [], []) is None

    def test_kubelet_restarts_count_toward_the_limit(self) -> None:
        spec = spec_of(tf_job("j", {"backoffLimit": 3}, worker=replica(2, "OnFailure")))
        assert failure.kubelet_backoff_exceeded(spec, 1, 2) is None
        assert failure.kubelet_backoff_exceeded(spec, 1, 3) == (
            "containers restarted 3 times, more than runPolicy.backoffLimit (3)")


class TestStartup:
    def test_the_launcher_waits_for_every_worker_to_be_ready(self) -> None:
        spec = spec_of(mpi_job("j", workers=2))
        launcher = PodKey("launcher", 0)
        assert startup.may_start(spec, PodKey("worker", 1), [])
        assert not startup.may_start(spec, launcher, [pod("worker", 0), pod("worker", 1, ready=False)])
        assert startup.may_start(spec, launcher, [pod("worker", 0), pod("worker", 1)])
        assert startup.waiting_for_workers(spec, "j", [pod("worker", 0)]).startswith("1/2 workers Ready")

    def test_immediately_starts_the_launcher_with_the_workers(self) -> None:
        job = mpi_job("j", workers=2)
        job["spec"]["mpi"]["launcherStart"] = "Immediately"
        assert startup.may_start(spec_of(job), PodKey("launcher", 0), [])


class TestClocks:
    def test_deadline_counts_from_the_start(self) -> None:
        run = spec_of(tf_job("j", {"activeDeadlineSeconds": 60}, worker=replica(1))).run_policy
        assert deadline.deadline_remaining(run, "2026-11-22T11:59:30Z", NOW) == 30
        assert deadline.deadline_remaining(run, "2026-11-22T11:58:00.5Z", NOW) == -59.5
        assert deadline.deadline_remaining(spec_of(tf_job(worker=replica(1))).run_policy, None, NOW) is None

    def test_ttl_counts_from_completion(self) -> None:
        run = spec_of(tf_job("j", {"ttlSecondsAfterFinished": 30}, worker=replica(1))).run_policy
        assert ttl.ttl_remaining(run, "2026-11-22T11:59:50Z", NOW) == 20
        assert ttl.ttl_remaining(run, "2026-11-22T11:59:00Z", NOW) == -30


@pytest.mark.parametrize(("policy", "deleted"), [
    (CleanPodPolicy.RUNNING, ["j-ps-0", "j-worker-1"]), (CleanPodPolicy.ALL, ["j-chief-0", "j-ps-0", "j-worker-1"]),
    (CleanPodPolicy.NONE, [])])
def test_cleanup(policy: CleanPodPolicy, deleted: list[str]) -> None:
    pods = [pod("chief", 0, "Succeeded"), pod("ps", 0), pod("worker", 1), pod("worker", 2, terminating=True)]
    assert sorted(p.name for p in cleanup.pods_to_clean(policy, pods)) == deleted
