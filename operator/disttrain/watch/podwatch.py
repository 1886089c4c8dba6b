"""Where pod events come in: the operator's own list+watch of the pods it made (label selector).

Not kopf's: kopf builds a body view, a memo, a state and a diff for every event of every
resource it watches (33% of the operator's CPU in a 200-job burst, profiled in issue 25), and
keeps a handler's return value per object. Here a pod event is decoded, reduced to an
`ObservedPod` and compared with the one held: a job is queued only when what reconciling reads
of its pods changed (a pod IP, a condition's timestamp or a kubelet's heartbeat cost nothing).

The list and watch are reflector.py's. A re-list replaces what is held: a pod deleted while no
watch ran is dropped there (the tombstones' re-list purge, tombstones.py, keeps running as the
safety net it was).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from disttrain.api.constants import GROUP, JOB_NAME_LABEL, KIND
from disttrain.api.objects import controller_of
from disttrain.api.observed import ObservedPod, observe_pod
from disttrain.apiserver.rest import Rest
from disttrain.watch.by_job import ByJob, JobKey, Listed
from disttrain.watch.pod_events import decode_event, decode_list
from disttrain.watch.reflector import Reflector, Resource, exact_names, watched

__all__ = ["POD_EVENTS_WITHIN", "PodWatch", "exact_names", "watched"]
PODS = Resource("v1", "pods", JOB_NAME_LABEL, decode_list, decode_event)
# A pod on its way up (made, bound, started, Ready) has its job reconciled this long after the first
# such change, not at once: the scheduler binds a job's pods and the kubelets start them one event each,
# a few milliseconds apart, and each event its own pass made 8 passes of a 5-pod job from apply to
# Running (1.2 to create it, 7 for its pods' binds and starts; `make bench` scale step, the reconcile
# count from /metrics). Kubernetes' Job controller batches its pods' events over 1 s
# (syncJobBatchPeriod). A pod's end or trouble (a terminal phase, a deletion, a disruption, a
# container stuck, exited or restarted, Ready lost) acts at once: batched too, 1,000 chiefs finishing
# together took 1.2 s at p99 to Succeeded where they took 0.42; so do a job's own events and its
# progress reports.
POD_EVENTS_WITHIN = 0.25


def on_its_way_up(pod: ObservedPod, before: ObservedPod | None) -> bool:
    """A change whose reaction may wait POD_EVENTS_WITHIN: nothing ended, nothing went wrong (no
    container restarted or exited, and a Ready pod stayed Ready)."""
    if pod.phase not in ("Pending", "Running") or pod.terminating:
        return False
    if pod.disruption is not None or pod.stuck is not None:
        return False
    if before is None:
        return True
    lost_ready = before.ready and not pod.ready
    return (before.container_restarts == pod.container_restarts and before.exit_code == pod.exit_code
            and not lost_ready)


def controlled_by_its_job(meta: Mapping[str, Any]) -> bool:
    """A pod controlled by a DistTrainJob of the name its job-name label gives: this job's, or an
    earlier one's of the same name (told apart by UID when reconciling)."""
    ref = controller_of(meta)
    return (ref is not None and ref.get("kind") == KIND and str(ref.get("apiVersion", "")).startswith(GROUP)
            and ref.get("name") == (meta.get("labels") or {}).get(JOB_NAME_LABEL))


class PodWatch:
    def __init__(self, rest: Rest, namespaces: Iterable[str], changed: Callable[[JobKey], None],
                 deleted: Callable[[JobKey, ObservedPod], None] = lambda key, pod: None,
                 coming_up: Callable[[JobKey], None] | None = None) -> None:
        """`namespaces`: exact names (a watch in each), or globs / none (one cluster-wide watch).
        `changed(key)` when a job's pods changed; `coming_up(key)` instead (default: `changed`) when
        the change was a pod on its way up (`on_its_way_up`); `deleted(key, pod)` with a deleted
        pod's last state."""
        self.changed, self.deleted = changed, deleted
        self.coming_up = coming_up or changed
        self.view: ByJob[ObservedPod] = ByJob()  # the index the controller reads
        self.reflector: Reflector[Listed[ObservedPod]] = Reflector(rest, PODS, namespaces, self._hold,
                                                                   self._replace, self._apply)
        self.synced = self.reflector.synced  # every scope has listed: reconciling may begin

    def find(self, uid: str) -> tuple[JobKey, ObservedPod] | None:
        """The pod of this uid and its job's key, if it is one of ours (the progress endpoint asks)."""
        return self.view.find(uid)

    async def run(self) -> None:
        await self.reflector.run()

    def _hold(self, pod: Mapping[str, Any]) -> Listed[ObservedPod] | None:
        key = self._key(pod.get("metadata") or {})
        return None if key is None else (key, pod["metadata"]["uid"], observe_pod(pod))

    def _replace(self, scope: str | None, listed: list[Listed[ObservedPod]]) -> None:
        for key in self.view.replace(scope, listed):
            self.changed(key)

    def _apply(self, kind: str, pod: Mapping[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        uid = meta.get("uid", "")
        key = None if kind == "DELETED" else self._key(meta)
        observed = observe_pod(pod)
        before = self.view.find(uid)
        left, changed = self.view.apply(uid, key, observed)
        if left is not None:
            if kind == "DELETED":  # its final state may say why it went (tombstones.py)
                self.deleted(left, observed)
            self.changed(left)
        if changed and key is not None:
            was = before[1] if before is not None and before[0] == key else None
            (self.coming_up if on_its_way_up(observed, was) else self.changed)(key)

    def _key(self, meta: Mapping[str, Any]) -> JobKey | None:
        if not controlled_by_its_job(meta) or not self.reflector.keeps(meta.get("namespace", "")):
            return None
        return meta.get("namespace", ""), meta["labels"][JOB_NAME_LABEL]
