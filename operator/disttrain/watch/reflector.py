"""One resource's list+watch, as client-go's reflector: the loop of every watch of the operator's
(jobs, pods, Kueue's Workloads).

List (paged), then watch from the list's resourceVersion with bookmarks, resume where the last
event left off when the server ends a watch, and list afresh when the resourceVersion has expired
(410 Gone). A re-list replaces what the store holds in that scope: an object deleted while no watch
ran is dropped there. Nothing here outlives the process: a new one lists.

What it follows is the store's: `hold` turns one listed object into what is kept (None: not ours),
`replace` takes a scope's whole list, `apply` one watch event. The decoders read only what the
store keeps (pod_events.py, job_events.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from fnmatch import fnmatch
from typing import Any, Generic, TypeVar

from disttrain.apiserver.rest import ApiError, Rest, list_pages, path
from disttrain.apiserver.retries import TRANSIENT

log = logging.getLogger(__name__)
PAGE = 500  # objects per list page: a re-list of 20,000 pods never holds more than one page's JSON
WATCH_SECONDS = 270  # the server ends each watch (as kopf's server_timeout); we resume from the last version
RETRY_SECONDS = (1.0, 30.0)  # backoff after a failed list or watch: first, at most
NOT_SERVED_SECONDS = 60.0  # between looks for an optional resource the cluster doesn't serve
WATCH_PAUSE_SECONDS = 1.0  # between the starts of two watches of one scope, at least

Held = TypeVar("Held")


class Gone(Exception):
    """The resourceVersion we resume from has expired: list again."""


def exact_names(namespaces: Iterable[str]) -> bool:
    """`disttrain run -n` named namespaces exactly (no glob): a watch in each, and nobody need list
    the cluster's namespaces to find them (a namespaced install's Roles don't allow it)."""
    names = list(namespaces)
    return bool(names) and not any(set(n) & set("*?[]!, ") for n in names)


def watched(namespace: str, patterns: Iterable[str]) -> bool:
    """Whether a cluster-wide watch keeps `namespace`, given `disttrain run -n` patterns, read as kopf
    reads them (kopf/_cogs/structs/references.py, match_namespace; tests/unit/test_podwatch.py
    compares the two): each -n is a pattern, and any one matching keeps the namespace; a pattern
    is comma-separated globs, spaces ignored; its first inclusive glob matches, a `!glob` after
    it excludes, and a later inclusive glob takes back only what the first matched; a pattern
    that starts with `!` starts from `*`. No patterns: every namespace."""
    patterns = list(patterns)
    return not patterns or any(_matches(namespace, pattern) for pattern in patterns)


def _matches(namespace: str, pattern: str) -> bool:
    globs = [glob.strip() for glob in pattern.split(",")]
    if globs[0].startswith("!"):
        globs.insert(0, "*")
    matched = first = fnmatch(namespace, globs[0])
    for glob in globs[1:]:
        if glob.startswith("!"):
            matched = matched and not fnmatch(namespace, glob[1:])
        else:
            matched = matched or (first and fnmatch(namespace, glob))
    return matched


@dataclass(frozen=True)
class Resource:
    """What is followed: `api_version` and `plural` (pods: "v1", "pods"), with a label selector."""
    api_version: str
    plural: str
    label_selector: str
    decode_list: Callable[[bytes], tuple[list[Any], str, str]]  # a page: its objects, version, continue token
    decode_event: Callable[[bytes], tuple[str, Any]]  # a watch line: its type and object
    # Served only where another project is installed (Kueue's Workloads): not served (a 404 that
    # discovery confirms) counts as listed, and is looked for again every NOT_SERVED_SECONDS.
    optional: bool = False


class Reflector(Generic[Held]):
    def __init__(self, rest: Rest, resource: Resource, namespaces: Iterable[str],
                 hold: Callable[[Any], Held | None], replace: Callable[[str | None, list[Held]], None],
                 apply: Callable[[str, Mapping[str, Any]], None]) -> None:
        """`namespaces`: exact names (a watch in each), or globs / none (one cluster-wide watch,
        whose objects the store filters with `watched`)."""
        names = list(dict.fromkeys(namespaces))  # a namespace named twice is watched once
        self.scopes: list[str | None] = list(names) if exact_names(names) else [None]
        self.patterns = [] if exact_names(names) else names
        self.rest, self.resource = rest, resource
        self.hold, self.replace, self.apply = hold, replace, apply
        self.synced = asyncio.Event()  # set once every scope has listed
        self._listed: set[str | None] = set()
        self.scope_served: dict[str | None, bool] = {}  # an optional resource's: False while not served

    def keeps(self, namespace: str) -> bool:
        return not self.patterns or watched(namespace, self.patterns)

    async def run(self) -> None:
        await asyncio.gather(*(self._follow(scope) for scope in self.scopes))

    async def _follow(self, scope: str | None) -> None:
        version, failures, what = "", 0, f"{self.resource.plural} watch{_where(scope)}"
        watched_at = -WATCH_PAUSE_SECONDS
        while True:
            try:
                if not version:
                    version = await self._list(scope)
                    if self.scope_served.get(scope) is False:
                        log.info("%s: served now", what)
                    self.scope_served[scope] = True
                    self._synced(scope)
                # A watch the server (or a proxy) ends at once is not asked for again at once.
                await asyncio.sleep(max(0.0, watched_at + WATCH_PAUSE_SECONDS - time.monotonic()))
                watched_at = time.monotonic()
                version = await self._watch(scope, version)
                failures = 0
            except Gone:
                log.info("%s: resourceVersion %s expired, listing again", what, version)
                version = ""
            except asyncio.CancelledError:
                raise
            except Exception as err:  # anything else: said, and listed afresh after a back-off
                if await self._not_served(scope, err):
                    if self.scope_served.get(scope) is not False:
                        log.info("%s: not served here (%s); looking again every %.0fs", what,
                                 self.resource.api_version, NOT_SERVED_SECONDS)
                    self.scope_served[scope], version, failures = False, "", 0
                    self._synced(scope)  # what it holds stays: only a list replaces it
                    await asyncio.sleep(NOT_SERVED_SECONDS)
                    continue
                failures += 1
                wait = min(RETRY_SECONDS[1], RETRY_SECONDS[0] * 2 ** (failures - 1))
                if isinstance(err, (ApiError, *TRANSIENT)):
                    log.warning("%s failed (retrying in %.0fs): %s: %s", what, wait, type(err).__name__, err)
                    if isinstance(err, ApiError) and err.status == 410:
                        version = ""
                else:  # our own defect, not the API server's: its traceback, and a fresh list
                    log.exception("%s: unexpected error (listing again in %.0fs)", what, wait)
                    version = ""
                await asyncio.sleep(wait)

    async def _not_served(self, scope: str | None, err: Exception) -> bool:
        """An optional resource's 404, and discovery agrees that the cluster doesn't serve it. A 404
        alone is not enough: the API server answers one for a custom resource it does serve around
        its restarts (kubernetes/kubernetes#71218), and a store emptied on one would have the
        controller stop every queued job's pods as if its Workload were gone (issue 45's review)."""
        if not (self.resource.optional and isinstance(err, ApiError) and err.status == 404):
            return False
        try:
            found = await self.rest.request("GET", "/apis/" + self.resource.api_version)
        except ApiError as discovery:
            return discovery.status == 404
        except TRANSIENT:
            return False
        return not any(r.get("name") == self.resource.plural for r in (found or {}).get("resources") or ())

    def _synced(self, scope: str | None) -> None:
        self._listed.add(scope)
        if len(self._listed) == len(self.scopes):
            self.synced.set()

    async def _list(self, scope: str | None) -> str:
        """Every object in `scope`, paged, each kept as the store holds it (one page's JSON at a time)."""
        found: list[Held] = []
        params = {"labelSelector": self.resource.label_selector, "limit": str(PAGE)}
        version = ""
        url = path(self.resource.api_version, self.resource.plural, scope)
        async for items, listed_at, _ in list_pages(self.rest, url, params, self.resource.decode_list,
                                                   lambda page: page[2]):
            version = listed_at  # every page's is the first's: one snapshot
            found += (held for item in items if (held := self.hold(item)) is not None)
        self.replace(scope, found)
        return version

    async def _watch(self, scope: str | None, version: str) -> str:
        """Follow from `version` until the server ends the watch: the version to resume from."""
        params = {"labelSelector": self.resource.label_selector, "resourceVersion": version,
                  "allowWatchBookmarks": "true", "timeoutSeconds": str(WATCH_SECONDS)}
        url = path(self.resource.api_version, self.resource.plural, scope)
        async for line in self.rest.watch_lines(url, params, read_timeout=WATCH_SECONDS + 30):
            kind, obj = self.resource.decode_event(line)
            if kind == "ERROR":
                if obj.get("code") == 410:
                    raise Gone(obj.get("message"))
                raise ApiError(int(obj.get("code") or 500), str(obj.get("reason") or "watch error"), line)
            version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
            if kind != "BOOKMARK":
                self.apply(kind, obj)
        return version


def _where(scope: str | None) -> str:
    return f" in {scope}" if scope else ""
