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

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from disttrain.api.constants import GROUP, JOB_NAME_LABEL, KIND
from disttrain.api.objects import controller_of
from disttrain.api.observed import ObservedPod, observe_pod
from disttrain.apiserver.rest import Rest
from disttrain.watch.pod_events import decode_event, decode_list
from disttrain.watch.reflector import Reflector, Resource, exact_names, watched

__all__ = ["PodWatch", "PodsByJob", "exact_names", "watched"]
JobKey = tuple[str, str]
PODS = Resource("v1", "pods", JOB_NAME_LABEL, decode_list, decode_event)
Listed = tuple[JobKey, str, ObservedPod]  # a listed pod of ours: its job's key, its uid, what is held


def controlled_by_its_job(meta: Mapping[str, Any]) -> bool:
    """A pod controlled by a DistTrainJob of the name its job-name label gives: this job's, or an
    earlier one's of the same name (told apart by UID when reconciling)."""
    ref = controller_of(meta)
    return (ref is not None and ref.get("kind") == KIND and str(ref.get("apiVersion", "")).startswith(GROUP)
            and ref.get("name") == (meta.get("labels") or {}).get(JOB_NAME_LABEL))


class PodsByJob(Mapping[JobKey, Iterable[ObservedPod]]):
    """The index the controller reads: a job's key -> its pods, as they are now."""

    def __init__(self, held: dict[JobKey, dict[str, ObservedPod]]) -> None:
        self._held = held

    def __getitem__(self, key: JobKey) -> Iterable[ObservedPod]:
        return self._held[key].values()

    def __iter__(self) -> Iterator[JobKey]:
        return iter(self._held)

    def __len__(self) -> int:
        return len(self._held)


class PodWatch:
    def __init__(self, rest: Rest, namespaces: Iterable[str], changed: Callable[[JobKey], None],
                 deleted: Callable[[JobKey, ObservedPod], None] = lambda key, pod: None) -> None:
        """`namespaces`: exact names (a watch in each), or globs / none (one cluster-wide watch).
        `changed(key)` when a job's pods changed; `deleted(key, pod)` with a deleted pod's last state."""
        self.changed, self.deleted = changed, deleted
        self.held: dict[JobKey, dict[str, ObservedPod]] = {}  # job -> uid -> pod
        self.where: dict[str, JobKey] = {}  # uid -> job: a pod whose label changes is found
        self.view = PodsByJob(self.held)
        self.reflector: Reflector[Listed] = Reflector(rest, PODS, namespaces, self._hold, self._replace, self._apply)
        self.synced = self.reflector.synced  # every scope has listed: reconciling may begin

    def find(self, uid: str) -> tuple[JobKey, ObservedPod] | None:
        """The pod of this uid and its job's key, if it is one of ours (the progress endpoint asks)."""
        key = self.where.get(uid)
        pod = self.held.get(key, {}).get(uid) if key is not None else None
        return (key, pod) if key is not None and pod is not None else None

    async def run(self) -> None:
        await self.reflector.run()

    def _hold(self, pod: Mapping[str, Any]) -> Listed | None:
        key = self._key(pod.get("metadata") or {})
        return None if key is None else (key, pod["metadata"]["uid"], observe_pod(pod))

    def _replace(self, scope: str | None, listed: list[Listed]) -> None:
        """A scope's list: what was held there and is absent now is dropped."""
        found: dict[JobKey, dict[str, ObservedPod]] = {}
        for key, uid, observed in listed:
            found.setdefault(key, {})[uid] = observed
        before = [key for key in self.held if scope is None or key[0] == scope]
        for key in before:
            for uid in self.held[key]:
                del self.where[uid]
            if key not in found:
                del self.held[key]
                self.changed(key)
        for key, pods in found.items():
            self.where.update(dict.fromkeys(pods, key))
            if self.held.get(key) != pods:
                self.held[key] = pods
                self.changed(key)

    def _apply(self, kind: str, pod: Mapping[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        uid = meta.get("uid", "")
        key = None if kind == "DELETED" else self._key(meta)
        held_at = self.where.get(uid)
        if held_at is not None and held_at != key:  # deleted, or no longer ours (its label or owner edited)
            self._drop(held_at, uid)
            if kind == "DELETED":  # its final state may say why it went (tombstones.py)
                self.deleted(held_at, observe_pod(pod))
            self.changed(held_at)
        if key is None:
            return
        observed = observe_pod(pod)
        pods = self.held.setdefault(key, {})
        if pods.get(uid) != observed:
            pods[uid], self.where[uid] = observed, key
            self.changed(key)

    def _drop(self, key: JobKey, uid: str) -> None:
        pods = self.held[key]
        del pods[uid], self.where[uid]
        if not pods:
            del self.held[key]

    def _key(self, meta: Mapping[str, Any]) -> JobKey | None:
        if not controlled_by_its_job(meta) or not self.reflector.keeps(meta.get("namespace", "")):
            return None
        return meta.get("namespace", ""), meta["labels"][JOB_NAME_LABEL]
