"""The typed client as a new user meets it (issue 43): everything a Job is built of imports from
`disttrain.client`, a Gloo job needs no launcher, and a Job's own namespace is where it goes."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from kubernetes import client as kube

import disttrain.client
from disttrain.client import MPI, Client, Container, Job, Replica, Spec, TensorFlow
from fake_apiserver import JSONHandler, serving


def test_every_class_of_a_job_imports_from_the_client() -> None:
    from disttrain.client import Elastic, MPIBootstrap  # noqa: F401  (ImportError before)

    assert {"Elastic", "MPIBootstrap"} <= set(disttrain.client.__all__)


def worker() -> Replica:
    return Replica(replicas=2, container=Container("horovod", command=["python", "train.py"]))


def test_a_gloo_job_needs_no_launcher() -> None:
    spec = MPI(worker=worker(), bootstrap="Gloo").to_dict()  # type: ignore[arg-type]
    assert spec["bootstrap"] == "Gloo" and "launcher" not in spec


def test_positional_mpi_keeps_its_order_and_ssh_still_needs_a_launcher() -> None:
    launcher = Replica(container=Container("horovod", command=["mpirun", "python", "train.py"]))
    assert MPI(launcher, worker()).to_dict()["launcher"]["template"]
    with pytest.raises(ValueError, match="launcher"):
        MPI(worker=worker()).to_dict()
    with pytest.raises(TypeError, match="worker"):
        MPI()


class _Recorder(JSONHandler):
    paths: list[str] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.paths.append(self.path)
        self.send_json(201, body)


@pytest.fixture
def server() -> Iterator[str]:
    with serving(_Recorder) as url:
        yield url


def test_a_jobs_own_namespace_is_where_submit_puts_it(server: str) -> None:
    configuration = kube.Configuration(host=server)
    _Recorder.paths = []
    with Client("team-a", api_client=kube.ApiClient(configuration)) as dt:
        dt.submit(Job("mnist", Spec(tensorflow=TensorFlow(worker=worker())), namespace="team-b"))
        dt.submit(Job("other", Spec(tensorflow=TensorFlow(worker=worker()))))
    assert [p.split("/")[5] for p in _Recorder.paths] == ["team-b", "team-a"]
