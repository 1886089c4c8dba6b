"""`disttrain logs`: prefixes, which container logs to read, and following a job through
restarts to its end, against a small log source of the API's own shape (tests/fake_logsource.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from disttrain.client.joblogs import JobNotFound, LogLine, job_logs, lines, source_name, streams
from fake_logsource import FakeLogSource


class Follow:
    """`disttrain logs -f` in a thread, its lines collected as they come."""

    def __init__(self, source: FakeLogSource, **options: object) -> None:
        self.lines: list[LogLine] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(source, options), daemon=True)
        self.thread.start()

    def _run(self, source: FakeLogSource, options: dict[str, object]) -> None:
        for line in job_logs(source, "ns", "mnist", follow=True, poll=0.02, **options):  # type: ignore[arg-type]
            self.lines.append(line)
        self.done.set()

    def text(self) -> list[str]:
        return [str(line) for line in self.lines]

    def wait_for(self, check: Callable[[list[str]], bool], what: str) -> None:
        deadline = time.monotonic() + 5
        while not check(self.text()):
            assert time.monotonic() < deadline, f"timed out waiting for {what}; got {self.text()}"
            time.sleep(0.01)

    def finish(self) -> list[str]:
        assert self.done.wait(5), f"logs -f did not end; got {self.text()}"
        return self.text()


def test_lines_are_whole_whatever_the_chunks() -> None:
    assert list(lines([b"ep", b"och 1\nepoch", b" 2\r\n", b"\n", b"last"])) == ["epoch 1", "epoch 2", "", "last"]
    assert list(lines([b"caf\xc3", b"\xa9\n"])) == ["café"]


def test_prefix_names_the_replica_and_the_container_when_there_are_several() -> None:
    source = FakeLogSource()
    source.add_pod("worker", 1)
    source.add_pod("launcher", 0)
    source.add_pod("chief", 0, containers=("tensorflow", "sidecar"))
    pods = {p["metadata"]["name"]: p for p in source.pods("ns", "")}
    assert source_name(pods["mnist-worker-1"], "tensorflow") == "worker-1"
    assert source_name(pods["mnist-launcher"], "launcher") == "launcher"
    assert source_name(pods["mnist-chief-0"], "sidecar") == "chief-0/sidecar"


def test_only_started_containers_of_this_job_are_read_in_pod_order() -> None:
    source = FakeLogSource()
    source.add_pod("worker", 10)
    source.add_pod("worker", 2)
    source.add_pod("ps", 0, started=False)
    source.add_pod("evaluator", 0, owner="an-earlier-job-of-the-same-name")
    keys = streams(source.pods("ns", ""), source.uid)
    assert [k.source for k in keys] == ["worker-2", "worker-10"]


def test_without_follow_each_log_once_prefixed_pod_after_pod() -> None:
    source = FakeLogSource()
    for i in range(2):
        source.add_pod("worker", i)
        source.write(f"mnist-worker-{i}", f"hello from {i}\nepoch 1\n")
    assert [str(line) for line in job_logs(source, "ns", "mnist")] == [
        "[worker-0] hello from 0", "[worker-0] epoch 1", "[worker-1] hello from 1", "[worker-1] epoch 1"]


def test_type_filter_and_previous_container() -> None:
    source = FakeLogSource()
    source.add_pod("ps", 0)
    source.add_pod("worker", 0)
    source.write("mnist-worker-0", "first life\n")
    source.restart_container("mnist-worker-0")
    source.write("mnist-worker-0", "second life\n")
    assert [str(x) for x in job_logs(source, "ns", "mnist", replica_type="worker")] == ["[worker-0] second life"]
    assert [str(x) for x in job_logs(source, "ns", "mnist", previous=True)] == ["[worker-0] first life"]


def test_follow_interleaves_as_lines_arrive_and_ends_with_the_job() -> None:
    source = FakeLogSource()
    source.add_pod("worker", 0)
    source.add_pod("worker", 1)
    follow = Follow(source)
    source.write("mnist-worker-0", "w0 epoch 1\n")
    follow.wait_for(lambda got: "[worker-0] w0 epoch 1" in got, "worker 0's first line")
    source.write("mnist-worker-1", "w1 epoch 1\n")
    follow.wait_for(lambda got: "[worker-1] w1 epoch 1" in got, "worker 1's first line")
    source.write("mnist-worker-0", "w0 epoch 2\n")
    follow.wait_for(lambda got: len(got) == 3, "the third line")
    for i in range(2):
        source.write(f"mnist-worker-{i}", "done")  # no newline: still a line
        source.exit(f"mnist-worker-{i}")
    source.phase = "Succeeded"
    got = follow.finish()
    assert got[:3] == ["[worker-0] w0 epoch 1", "[worker-1] w1 epoch 1", "[worker-0] w0 epoch 2"]
    assert sorted(got[3:]) == ["[worker-0] done", "[worker-1] done"]  # the two pods' last lines, in either order


def test_follow_goes_on_with_the_pods_a_restart_makes() -> None:
    source = FakeLogSource()
    source.add_pod("worker", 0)
    follow = Follow(source)
    source.write("mnist-worker-0", "before\n")
    follow.wait_for(lambda got: "[worker-0] before" in got, "the first pod's line")
    source.phase = "Restarting"
    source.delete_pod("mnist-worker-0")  # the operator replaces the pod
    source.add_pod("worker", 0, started=False)
    source.start("mnist-worker-0")
    source.write("mnist-worker-0", "resumed at epoch 3\n")
    follow.wait_for(lambda got: "[worker-0] resumed at epoch 3" in got, "the new pod's line")
    source.restart_container("mnist-worker-0")  # the kubelet restarts its container
    source.write("mnist-worker-0", "third life\n")
    follow.wait_for(lambda got: "[worker-0] third life" in got, "the restarted container's line")
    source.exit("mnist-worker-0")
    source.phase = "Succeeded"
    got = follow.finish()
    assert [line for line in got if "restarted" not in line] == [
        "[worker-0] before", "[worker-0] resumed at epoch 3", "[worker-0] third life"]
    assert sum("--- restarted" in line for line in got) == 2


def test_a_container_restarted_between_two_looks_is_read_as_the_previous_one() -> None:
    source = FakeLogSource()
    source.add_pod("worker", 0)
    source.write("mnist-worker-0", "first life\n")
    source.restart_container("mnist-worker-0")  # before `logs -f` looked
    source.write("mnist-worker-0", "second life\n")
    follow = Follow(source)
    follow.wait_for(lambda got: "[worker-0] second life" in got, "the current container's line")
    source.exit("mnist-worker-0")
    source.phase = "Succeeded"
    assert follow.finish() == ["[worker-0] first life", "[worker-0] --- restarted: pod mnist-worker-0, container "
                               "tensorflow (restart 1) ---", "[worker-0] second life"]


def test_a_log_that_cant_be_read_is_said_and_the_others_go_on() -> None:
    source = FakeLogSource()
    source.add_pod("worker", 0)
    source.add_pod("worker", 1)
    source.broken.add("mnist-worker-0")
    source.write("mnist-worker-1", "fine\n")
    source.exit("mnist-worker-1")
    source.phase = "Failed"
    got = list(job_logs(source, "ns", "mnist", follow=True, poll=0.02))
    assert sorted((x.source, x.error) for x in got) == [("worker-0", True), ("worker-1", False)]
    assert "no kubelet to ask" in next(x.text for x in got if x.error)


def test_a_pod_that_outlives_the_job_is_left_after_linger() -> None:
    source = FakeLogSource()
    source.add_pod("ps", 0)  # cleanPodPolicy None: it runs on
    source.write("mnist-ps-0", "serving\n")
    source.phase = "Succeeded"
    started = time.monotonic()
    assert [str(x) for x in job_logs(source, "ns", "mnist", follow=True, poll=0.02, linger=0.2)] == ["[ps-0] serving"]
    assert time.monotonic() - started < 3


def test_follow_ends_when_the_job_is_deleted_and_a_missing_job_is_an_error() -> None:
    source = FakeLogSource()
    source.add_pod("worker", 0)
    follow = Follow(source)
    source.deleted = True
    source.delete_pod("mnist-worker-0")
    follow.finish()
    with pytest.raises(JobNotFound, match="no DistTrainJob ns/mnist"):
        list(job_logs(source, "ns", "mnist"))
