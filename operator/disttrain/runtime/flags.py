"""The commands' flags. `disttrain run`'s numbers are checked as the chart's values.schema.json
checks the value each comes from: a flag out of range stops the operator at start-up with
argparse's one line, rather than an operator that runs no workers or rewrites every job's status
in a loop."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable


def bounded(kind: type[int] | type[float], low: float, high: float = math.inf,
            above: bool = False) -> Callable[[str], int | float]:
    """A flag's type: a number of `kind` from `low` (or above it, with `above`) to `high`."""
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: not {'a whole number' if kind is int else 'a number'}") \
                from None
        # `not (...)`: nan fails every comparison, and is refused with the rest.
        if not ((value > low if above else value >= low) and value <= high and math.isfinite(value)):
            upper = "" if high == math.inf else f" and at most {high:g}"
            raise argparse.ArgumentTypeError(f"{text}: must be {'more than' if above else 'at least'} {low:g}{upper}")
        return value
    parse.__name__ = kind.__name__  # argparse names the type in its "invalid ... value" line
    return parse


PORT = bounded(int, 1, 65535)
OPTIONAL_PORT = bounded(int, 0, 65535)  # 0: not served


def add_run_arguments(run: argparse.ArgumentParser) -> None:
    run.add_argument("--namespace", "-n", action="append", default=[],
                     help="watch only this namespace (repeatable); default: the whole cluster")
    run.add_argument("--leader-election", action="store_true",
                     help="run only while holding a Lease, so several replicas can run with one active")
    run.add_argument("--leader-election-namespace", default=os.environ.get("POD_NAMESPACE", "default"),
                     help="namespace of the Lease ($POD_NAMESPACE, else default)")
    run.add_argument("--lease-name", default="disttrain-operator", help="the Lease's name")
    run.add_argument("--lease-duration", type=bounded(int, 1), default=15, help="seconds before a standby takes over")
    run.add_argument("--metrics-port", type=OPTIONAL_PORT, default=0,
                     help="serve Prometheus metrics on this port; 0: off")
    run.add_argument("--health-port", type=OPTIONAL_PORT, default=0,
                     help="serve /healthz (alive, standing by included) and /readyz (the leader) on this port; 0: off")
    run.add_argument("--workers", type=bounded(int, 1), default=16, help="jobs reconciled at once")
    run.add_argument("--resync-seconds", type=bounded(float, 0, above=True), default=300.0,
                     help="seconds between re-lists of the pods")
    run.add_argument("--progress-port", type=OPTIONAL_PORT, default=0,
                     help="take the pods' training progress reports on this port (HTTPS); 0: off")
    run.add_argument("--progress-url", help="the endpoint's address as the pods reach it "
                     "(default: https://127.0.0.1:PORT, for pods run on this machine)")
    run.add_argument("--progress-tls-secret", default=f"{os.environ.get('POD_NAMESPACE') or 'default'}/"
                     "disttrain-progress-tls", help="NAMESPACE/NAME of the Secret holding the endpoint's CA and "
                     "certificate (made if absent)")
    run.add_argument("--progress-status-seconds", type=bounded(float, 1), default=15.0,
                     help="write a job's reported progress to its status at most once in this many seconds")
    run.add_argument("--progress-pods", metavar="NAMESPACE/KEY=VALUE[,KEY=VALUE...]",
                     help="the pods serving the endpoint (the chart's operator pods): a job's NetworkPolicy with "
                     "egress PeersAndDNS lets its pods report to them")
    run.add_argument("--hook-image", default="",
                     help="with --progress-port: an image holding disttrain_progress (the operator's own) whose init "
                     "container gives every job's pods the progress and checkpoint hook, whatever their image "
                     "(runPolicy.injectProgressHook); empty: none")
    run.add_argument("--progress-memory-mib", type=bounded(int, 128), default=384,
                     help="the progress endpoint's process's memory bound (it runs apart from the controller)")
    run.add_argument("--name-reuse-seconds", type=bounded(float, 0, 3600), default=6.0,
                     help="seconds a job's new pods wait, once the old pods of the same names are gone (a "
                     "whole-job restart, a resume), for DNS answers naming the old addresses to expire: the "
                     "cluster DNS's pod-record TTL (CoreDNS: 5) plus a second")
    run.add_argument("--gpu-device-class", action="append", default=[], metavar="NAME",
                     help="a DRA DeviceClass whose devices are GPUs (repeatable), besides those whose selectors pin "
                     "NVIDIA's driver gpu.nvidia.com: an MPI worker's claims on them give it its slots")
    run.add_argument("--verbose", "-v", action="store_true",
                     help="debug logs (each refused progress report among them)")


def add_job_arguments(cmd: argparse.ArgumentParser, follow_help: str) -> argparse.ArgumentParser:
    """`logs` and `progress`: a job, and how to reach it (as kubectl's flags)."""
    cmd.add_argument("job", help="the DistTrainJob's name")
    cmd.add_argument("--namespace", "-n", help="default: the kubeconfig context's namespace")
    cmd.add_argument("--follow", "-f", action="store_true", help=follow_help)
    cmd.add_argument("--kubeconfig", help="default: $KUBECONFIG, ~/.kube/config, or in-cluster")
    cmd.add_argument("--context", help="the kubeconfig context to use")
    return cmd
