"""A Python client for DistTrainJobs, for scripts and notebooks:

    from disttrain.client import Client, Container, Job, Replica, RestartPolicy, Spec, TensorFlow

    job = Job("mnist", Spec(tensorflow=TensorFlow(worker=Replica(
        replicas=2, restart_policy=RestartPolicy.EXIT_CODE,
        container=Container("disttrain/tensorflow:2.21", command=["python", "/train.py"], cpu=2)))))
    with Client() as dt:                      # kubeconfig or in-cluster; the context's namespace
        dt.submit(job)
        dt.wait("mnist")                      # phase, ready pods, restarts as they change
        for line in dt.logs("mnist"):
            print(line)                       # [worker-0] ...
        dt.delete("mnist")
"""

from disttrain.api.spec import (
    CleanPodPolicy,
    Egress,
    GangProvider,
    LauncherStart,
    MPIBootstrap,
    MPIImplementation,
    RestartPolicy,
    RestartScope,
    SuccessPolicy,
)
from disttrain.client.joblogs import JobNotFound, LogLine
from disttrain.client.jobs import (
    MPI,
    Container,
    Elastic,
    Gang,
    Job,
    NetworkPolicy,
    Replica,
    RunPolicy,
    Scheduling,
    Spec,
    TensorFlow,
)
from disttrain.client.progress import JobStatus
from disttrain.client.training import Client, JobError

__all__ = [
    "MPI", "CleanPodPolicy", "Client", "Container", "Egress", "Elastic", "Gang", "GangProvider", "Job", "JobError",
    "JobNotFound", "JobStatus", "LauncherStart", "LogLine", "MPIBootstrap", "MPIImplementation", "NetworkPolicy",
    "Replica", "RestartPolicy", "RestartScope", "RunPolicy", "Scheduling", "Spec", "SuccessPolicy", "TensorFlow",
]
