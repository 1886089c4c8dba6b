"""In-memory stand-ins for our own seams (`KubeAPI`, `LeaseAPI`, `Clock`), for unit tests of the
controller and leader election. They model only what those call, not the Kubernetes API: the
integration tests run against a real API server."""

from __future__ import annotations

import asyncio
import copy
import datetime
import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from disttrain.api.observed import ObservedPod, observe_pod
from disttrain.apiserver.kube import Conflict, Invalid, NamespaceTerminating, NotServed, Refused

START = datetime.datetime(2026, 11, 22, 12, 0, 0, tzinfo=datetime.UTC)
_uids = itertools.count(1)


@dataclass
class FakeClock:
    wall: datetime.datetime = START
    mono: float = 1000.0

    def now(self) -> datetime.datetime:
        return self.wall

    def monotonic(self) -> float:
        return self.mono

    def advance(self, seconds: float) -> None:
        self.wall += datetime.timedelta(seconds=seconds)
        self.mono += seconds


def without_nulls(patch: Mapping[str, Any]) -> dict[str, Any]:
    return {k: without_nulls(v) if isinstance(v, Mapping) else copy.deepcopy(v) for k, v in patch.items()
            if v is not None}


def key_of(obj: Mapping[str, Any]) -> tuple[str, str, str]:
    return obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"]


@dataclass
class FakeKube:
    """Objects by (kind, namespace, name); every call recorded in `calls`."""

    objects: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)
    calls: list[tuple[str, str]] = field(default_factory=list)  # (verb, what)
    statuses: list[dict[str, Any]] = field(default_factory=list)
    status_versions: list[str | None] = field(default_factory=list)  # the resourceVersion each write named
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (type, reason, message)
    invalid: dict[str, str] = field(default_factory=dict)  # pod name -> the API server's complaint
    refused: dict[str, str] = field(default_factory=dict)  # pod name -> admission's refusal (403)
    conflicts: int = 0  # the next N status patches are refused
    terminating: set[str] = field(default_factory=set)  # namespaces being deleted: creates refused (403)
    delete_failures: list[Exception] = field(default_factory=list)  # the next pod deletes raise these
    lost_deletes: int = 0  # the next N pod deletes answer and do nothing
    get_failures: dict[str, Exception] = field(default_factory=dict)  # kind -> what reading one raises
    annotate_failures: list[Exception] = field(default_factory=list)  # the next pod annotations raise these

    def add(self, obj: dict[str, Any]) -> dict[str, Any]:
        stored = copy.deepcopy(obj)
        stored["metadata"].setdefault("uid", f"obj-{next(_uids)}")
        self.objects[key_of(stored)] = stored
        return stored

    async def create(self, obj: Mapping[str, Any]) -> str | None:
        self.calls.append(("create", "/".join(key_of(obj))))
        if obj["metadata"]["namespace"] in self.terminating:
            raise NamespaceTerminating(obj["metadata"]["namespace"])
        if obj["metadata"]["name"] in self.invalid:
            raise Invalid(self.invalid[obj["metadata"]["name"]])
        if obj["metadata"]["name"] in self.refused:
            raise Refused(self.refused[obj["metadata"]["name"]])
        if str(obj["apiVersion"]).startswith("scheduling.k8s.io/") and obj["apiVersion"] not in self.served:
            raise NotServed(f"not found: {obj['apiVersion']} {obj['kind']} (404): the server could not find the "
                            "requested resource")
        if key_of(obj) in self.objects:
            return None
        return str(self.add(dict(obj))["metadata"]["uid"])

    served: set[str] = field(default_factory=lambda: {"v1", "scheduling.k8s.io/v1alpha2"})

    async def get(self, obj: Mapping[str, Any]) -> dict[str, Any] | None:
        self.calls.append(("get", "/".join(key_of(obj))))
        if obj["kind"] in self.get_failures:
            raise self.get_failures[obj["kind"]]
        found = self.objects.get(key_of(obj))
        return copy.deepcopy(found) if found else None

    async def list_cluster(self, api_version: str, kind: str) -> list[dict[str, Any]]:
        self.calls.append(("list", kind))
        return [copy.deepcopy(o) for (k, _, _), o in self.objects.items() if k == kind]

    async def get_metadata(self, obj: Mapping[str, Any]) -> dict[str, Any] | None:
        found = await self.get(obj)
        return found["metadata"] if found else None

    async def delete(self, obj: Mapping[str, Any], uid: str) -> None:
        self.calls.append(("delete", "/".join(key_of(obj))))
        found = self.objects.get(key_of(obj))
        if found is not None and found["metadata"]["uid"] == uid:
            del self.objects[key_of(obj)]

    async def patch(self, obj: Mapping[str, Any], body: Mapping[str, Any], *, status: bool = False,
                    apply: bool = False, manager: str = "") -> None:
        """A merge patch, or (apply) a server-side apply whose conditions merge by type."""
        self.calls.append(("apply" if apply else "patch", "/".join(key_of(obj)) + ("/status" if status else "")))
        found = self.objects.get(key_of(obj))
        if found is None:
            return
        for part in ("spec", "status"):
            if part not in body:
                continue
            current = found.setdefault(part, {})
            for name, value in body[part].items():
                if apply and name == "conditions":
                    merged = {c["type"]: c for c in current.get("conditions") or []}
                    merged.update({c["type"]: c for c in value})
                    current["conditions"] = list(merged.values())
                elif value is None:
                    current.pop(name, None)
                else:
                    current[name] = copy.deepcopy(value)

    async def served_group_versions(self) -> set[str]:
        self.calls.append(("discover", "/apis"))
        return set(self.served)

    async def json_patch(self, obj: Mapping[str, Any], operations: list[Mapping[str, Any]]) -> None:
        """RFC 6902's test and replace, the two the operator sends."""
        self.calls.append(("json-patch", "/".join(key_of(obj))))
        found = self.objects.get(key_of(obj))
        if found is None:
            return
        for op in operations:
            *parents, last = [int(p) if p.isdigit() else p for p in str(op["path"]).strip("/").split("/")]
            target: Any = found
            for part in parents:
                target = target[part]
            if op["op"] == "test" and target[last] != op["value"]:
                raise Conflict(obj["metadata"]["name"])
            if op["op"] == "replace":
                target[last] = op["value"]

    async def patch_config_map_data(self, obj: Mapping[str, Any]) -> bool:
        self.calls.append(("patch", "/".join(key_of(obj))))
        found = self.objects.get(key_of(obj))
        if found is None:
            return False
        found["data"] = dict(obj["data"])
        return True

    async def annotate_pod(self, namespace: str, name: str, uid: str, annotations: dict[str, str]) -> bool:
        self.calls.append(("annotate", f"Pod/{namespace}/{name}"))
        if self.annotate_failures:
            raise self.annotate_failures.pop(0)
        found = self.objects.get(("Pod", namespace, name))
        if found is None or found["metadata"].get("uid", uid) != uid:
            return False
        found["metadata"].setdefault("annotations", {}).update(annotations)
        return True

    async def delete_pod(self, namespace: str, name: str, uid: str) -> None:
        self.calls.append(("delete", f"Pod/{namespace}/{name}"))
        if self.delete_failures:
            raise self.delete_failures.pop(0)
        if self.lost_deletes:
            self.lost_deletes -= 1
            return
        found = self.objects.get(("Pod", namespace, name))
        if found is not None and found["metadata"]["uid"] == uid:
            del self.objects[("Pod", namespace, name)]

    async def patch_job_status(self, namespace: str, name: str, status: Mapping[str, Any],
                               resource_version: str | None) -> dict[str, Any]:
        self.calls.append(("status", f"{namespace}/{name}"))
        if self.conflicts:
            self.conflicts -= 1
            raise Conflict(name)
        self.statuses.append(without_nulls(status))  # a merge patch's nulls remove, as the API server's
        self.status_versions.append(resource_version)
        return {"status": dict(status)}

    async def delete_job(self, namespace: str, name: str, uid: str) -> None:
        self.calls.append(("delete", f"DistTrainJob/{namespace}/{name}"))

    async def post_event(self, namespace: str, name: str, uid: str, event_type: str, reason: str,
                         message: str) -> None:
        self.events.append((event_type, reason, message))

    async def pod_uids(self, namespace: str) -> set[str]:
        self.calls.append(("list", f"Pod/{namespace}"))
        return {o["metadata"]["uid"] for (kind, ns, _), o in self.objects.items() if kind == "Pod" and ns == namespace}

    async def namespace_terminating(self, namespace: str) -> bool | None:
        self.calls.append(("get", f"Namespace/{namespace}"))
        return namespace in self.terminating

    async def close(self) -> None:
        pass

    def pods(self) -> list[dict[str, Any]]:
        return [o for (kind, _, _), o in self.objects.items() if kind == "Pod"]

    def observed(self, **status: Any) -> list[ObservedPod]:
        """The pods as the operator's watch would show them, each with `status` (a pod status)."""
        return [observe_pod({**pod, "status": status}) for pod in self.pods()]

    def writes(self, verb: str) -> list[str]:
        return [what for v, what in self.calls if v == verb]


@dataclass
class FakeLeases:
    """One store of Leases with resourceVersion compare-and-swap, shared by several electors."""

    leases: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    version: int = 0

    async def read(self, namespace: str, name: str) -> dict[str, Any] | None:
        await asyncio.sleep(0)  # let replicas that read together write together, as over a network
        found = self.leases.get((namespace, name))
        return copy.deepcopy(found) if found else None

    async def create(self, namespace: str, body: dict[str, Any]) -> bool:
        key = (namespace, body["metadata"]["name"])
        if key in self.leases:
            return False
        self._store(key, body)
        return True

    async def replace(self, namespace: str, name: str, body: dict[str, Any]) -> bool:
        current = self.leases.get((namespace, name))
        if current is None or current["metadata"]["resourceVersion"] != body["metadata"]["resourceVersion"]:
            return False
        self._store((namespace, name), body)
        return True

    def _store(self, key: tuple[str, str], body: dict[str, Any]) -> None:
        self.version += 1
        stored = copy.deepcopy(body)
        stored["metadata"]["resourceVersion"] = str(self.version)
        self.leases[key] = stored

