"""A pod name used again only once DNS has forgotten the pod that held it before.

A job's pods have fixed names (`<job>-<type>-<index>`), and its headless Service publishes each one
as `<pod>.<job>.<namespace>.svc` with `publishNotReadyAddresses`, terminating pods included, so
that a peer resolves it before it is ready. A whole-job restart, a resume after a suspend, and a
job applied again under the name of one just deleted make pods of the names just freed. A DNS
answer cached while an old pod was there still names the old pod's address: CoreDNS keeps it for
the record's TTL (5 s, its kubernetes plugin's default: coredns v1.14.2 plugin/kubernetes
kubernetes.go defaultTTL; its `cache` plugin never keeps an answer past the record's TTL, kubeadm's
`cache 30` included). TensorFlow resolves a peer once and fails on the first connection refused, so
a new worker handed an old address exits 1: the clean-clone run of 0376b65 failed that way, a
drained worker's address cached while it terminated and handed to its replacement's peer 1.8 s
after it was gone ("No route to host"; tests/e2e/test_checkpoint_before_stop.py, drain).

So the new pods are made `name_reuse_seconds` after the last old pod went away (`disttrain run
--name-reuse-seconds`, the chart's `nameReuseSeconds`: 6 by default, the TTL and a second
for the EndpointSlice change to reach DNS). `status.previousPods` keeps the wait across operator
restarts: `{}` while old pods hold the names, `{goneAt}` once they are gone (the first pass that
sees none), removed once the new pods are made. A job first seen with its old pods already gone
and no `previousPods` (an operator upgraded mid-restart) starts at once, as before.
"""

from __future__ import annotations

import datetime

from disttrain.api.status import micro_timestamp
from disttrain.api.times import parse_timestamp
from disttrain.decide.passes import PREVIOUS_PODS, Pass
from disttrain.decide.policies import waiting
from disttrain.decide.reasons import Reason


def names_taken(p: Pass) -> bool:
    """Whether any old pod holds a name of this job's: its own (going, or to go at a stop) or an
    earlier job's of the same name."""
    return bool(p.own) or bool(waiting.blocked_names(list(p.wanted), p.own, p.foreign))


def track(p: Pass, held: bool) -> None:
    """`held`: old pods (this job's last attempt's, or an earlier job's of the same name) still hold
    names its new pods take. Written once as they start going, and once when the last is gone."""
    previous = p.plan.status.get(PREVIOUS_PODS)
    if held and (previous is None or "goneAt" in previous):
        p.plan.status[PREVIOUS_PODS] = {}
    elif not held and previous is not None and "goneAt" not in previous:
        p.plan.status[PREVIOUS_PODS] = {"goneAt": micro_timestamp(p.now)}


def starting_whole(p: Pass) -> bool:
    """A whole start waits for old pods (a restart's, a resume's): every one of its pods is new."""
    return PREVIOUS_PODS in p.plan.status


def settling(p: Pass, name_reuse_seconds: float) -> bool:
    """True while the new pods wait for the old ones' DNS records to expire (a requeue is planned
    for then); False: make them now, and the wait is forgotten. A goneAt ahead of this operator's
    clock (another's, after a failover) waits no longer than name_reuse_seconds from now."""
    gone_at = parse_timestamp((p.plan.status.get(PREVIOUS_PODS) or {}).get("goneAt"))
    if gone_at is not None and name_reuse_seconds > 0:
        if gone_at > p.now:
            gone_at = p.now
            p.plan.status[PREVIOUS_PODS] = {"goneAt": micro_timestamp(p.now)}
        due = gone_at + datetime.timedelta(seconds=name_reuse_seconds)
        if due > p.now:
            p.plan.requeue_within((due - p.now).total_seconds())
            if p.plan.status.get("reason") == Reason.WAITING_FOR_PREVIOUS_JOB:
                p.plan.status["message"] = (
                    f"the earlier job's pods are gone; this job's are made at {due.strftime('%H:%M:%S')} UTC, once "
                    f"DNS answers naming their addresses have expired (the operator's --name-reuse-seconds)")
            return True
    forget(p)
    return False


def forget(p: Pass) -> None:
    p.plan.status.pop(PREVIOUS_PODS, None)
