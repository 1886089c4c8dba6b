"""Where pod events come in: the operator's own list+watch of the pods it made (label selector).

Not kopf's: kopf builds a body view, a memo, a state and a diff for every event of every
resource it watches (33% of the operator's CPU in a 200-job burst, profiled in issue 25), and
keeps a handler's return value per object. Here a pod event is decoded, reduced to an
`ObservedPod` and compared with the one held: a job is queued only when what reconciling reads
of its pods changed (a pod IP, a condition's timestamp or a kubelet's heartbeat cost nothing).

As client-go's reflector: list (paged), then watch from the list's resourceVersion with
bookmarks, resume where the last event left off when the server ends a watch, and list afresh
when the resourceVersion has expired (410 Gone). A re-list replaces what is held: a pod deleted
while no watch ran is dropped there (the tombstones' re-list purge, tombstones.py, keeps running
as the safety net it was). Nothing here outlives the process: a new one lists.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from fnmatch import fnmatch
from typing import Any

from disttrain.api.constants import GROUP, JOB_NAME_LABEL, KIND
from disttrain.api.objects import controller_of
from disttrain.api.observed import ObservedPod, observe_pod
from disttrain.apiserver.rest import ApiError, Rest, list_pages, path
from disttrain.apiserver.retries import TRANSIENT
from disttrain.watch.pod_events import decode_event, decode_list

JobKey = tuple[str, str]
log = logging.getLogger(__name__)
PAGE = 500  # pods per list page: a re-list of 20,000 pods never holds more than one page's JSON
WATCH_SECONDS = 270  # the server ends each watch (as kopf's server_timeout); we resume from the last version
RETRY_SECONDS = (1.0, 30.0)  # backoff after a failed list or watch: first, at most


class Gone(Exception):
    """The resourceVersion we resume from has expired: list again."""


def controlled_by_its_job(meta: Mapping[str, Any]) -> bool:
    """A pod controlled by a DistTrainJob of the name its job-name label gives: this job's, or an
    earlier one's of the same name (told apart by UID when reconciling)."""
    ref = controller_of(meta)
    return (ref is not None and ref.get("kind") == KIND and str(ref.get("apiVersion", "")).startswith(GROUP)
            and ref.get("name") == (meta.get("labels") or {}).get(JOB_NAME_LABEL))


def exact_names(namespaces: Iterable[str]) -> bool:
    """`disttrain run -n` named namespaces exactly (no glob): a watch in each, and kopf need not
    list the cluster's namespaces to find them (a namespaced install's Roles don't allow it)."""
    names = list(namespaces)
    return bool(names) and not any(set(n) & set("*?[]!,") for n in names)


def watched(namespace: str, patterns: Iterable[str]) -> bool:
    """Whether a cluster-wide watch keeps `namespace`, given `disttrain run -n` globs (kopf's
    syntax, as the job watch uses it: `ml-*`, `!ml-test`); no patterns: every namespace."""
    patterns = [p for item in patterns for p in item.split(",") if p]
    if any(p.startswith("!") and fnmatch(namespace, p[1:]) for p in patterns):
        return False
    positive = [p for p in patterns if not p.startswith("!")]
    return not positive or any(fnmatch(namespace, p) for p in positive)


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
        names = list(namespaces)
        self.scopes: list[str | None] = list(names) if exact_names(names) else [None]
        self.patterns = [] if exact_names(names) else names
        self.rest, self.changed, self.deleted = rest, changed, deleted
        self.held: dict[JobKey, dict[str, ObservedPod]] = {}  # job -> uid -> pod
        self.where: dict[str, JobKey] = {}  # uid -> job: a pod whose label changes is found
        self.view = PodsByJob(self.held)
        self.synced = asyncio.Event()  # set once every scope has listed: reconciling may begin
        self._listed: set[str | None] = set()

    def find(self, uid: str) -> tuple[JobKey, ObservedPod] | None:
        """The pod of this uid and its job's key, if it is one of ours (the progress endpoint asks)."""
        key = self.where.get(uid)
        pod = self.held.get(key, {}).get(uid) if key is not None else None
        return (key, pod) if key is not None and pod is not None else None

    async def run(self) -> None:
        await asyncio.gather(*(self._follow(scope) for scope in self.scopes))

    async def _follow(self, scope: str | None) -> None:
        version, failures = "", 0
        while True:
            try:
                if not version:
                    version = await self._list(scope)
                    self._listed.add(scope)
                    if len(self._listed) == len(self.scopes):
                        self.synced.set()
                version = await self._watch(scope, version)
                failures = 0
            except Gone:
                log.info("pod watch%s: resourceVersion %s expired, listing again", _where(scope), version)
                version = ""
            except (ApiError, *TRANSIENT) as err:
                failures += 1
                wait = min(RETRY_SECONDS[1], RETRY_SECONDS[0] * 2 ** (failures - 1))
                log.warning("pod watch%s failed (retrying in %.0fs): %s: %s", _where(scope), wait,
                            type(err).__name__, err)
                if isinstance(err, ApiError) and err.status == 410:
                    version = ""
                await asyncio.sleep(wait)

    async def _list(self, scope: str | None) -> str:
        """Every pod of ours in `scope`, paged; what was held there and is absent now is dropped."""
        found: dict[JobKey, dict[str, ObservedPod]] = {}
        params = {"labelSelector": JOB_NAME_LABEL, "limit": str(PAGE)}
        version = ""
        async for pods, listed_at, _ in list_pages(self.rest, path("v1", "pods", scope), params, decode_list,
                                                   lambda page: page[2]):
            version = listed_at  # every page's is the first's: one snapshot
            for pod in pods:
                key = self._key(pod.get("metadata") or {})
                if key is not None:
                    found.setdefault(key, {})[pod["metadata"]["uid"]] = observe_pod(pod)
        self._replace(scope, found)
        return version

    def _replace(self, scope: str | None, found: dict[JobKey, dict[str, ObservedPod]]) -> None:
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

    async def _watch(self, scope: str | None, version: str) -> str:
        """Follow from `version` until the server ends the watch: the version to resume from."""
        params = {"labelSelector": JOB_NAME_LABEL, "resourceVersion": version, "allowWatchBookmarks": "true",
                  "timeoutSeconds": str(WATCH_SECONDS)}
        async for line in self.rest.watch_lines(path("v1", "pods", scope), params, read_timeout=WATCH_SECONDS + 30):
            kind, obj = decode_event(line)
            if kind == "ERROR":
                if obj.get("code") == 410:
                    raise Gone(obj.get("message"))
                raise ApiError(int(obj.get("code") or 500), str(obj.get("reason") or "watch error"), line)
            version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
            if kind != "BOOKMARK":
                self._apply(kind, obj)
        return version

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
        namespace = meta.get("namespace", "")
        if not controlled_by_its_job(meta) or (self.patterns and not watched(namespace, self.patterns)):
            return None
        return namespace, meta["labels"][JOB_NAME_LABEL]


def _where(scope: str | None) -> str:
    return f" in {scope}" if scope else ""
