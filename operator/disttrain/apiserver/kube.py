"""The operator's few API writes over rest.py, errors sorted: already there, gone, conflict, invalid."""

from __future__ import annotations

import datetime
import logging
import os
import socket
from collections.abc import Mapping
from typing import Any

import msgspec

from disttrain.api.constants import API_VERSION, FIELD_MANAGER, GROUP, JOB_NAME_LABEL, KIND, PLURAL, VERSION
from disttrain.api.status import timestamp
from disttrain.apiserver.api_errors import REFUSALS, ErrorKind, classify
from disttrain.apiserver.rest import (
    APPLY_PATCH,
    JSON_PATCH,
    MERGE_PATCH,
    PARTIAL_METADATA,
    ApiError,
    Rest,
    list_pages,
    path,
)
from disttrain.apiserver.wire import Page

# The resource names of the kinds the operator writes or reads. ResourceFlavor and
# WorkloadPriorityClass are cluster-scoped.
PLURALS = {"Pod": "pods", "Service": "services", "ConfigMap": "configmaps", "Secret": "secrets",
           "Workload": "workloads", "PodGroup": "podgroups", "ResourceFlavor": "resourceflavors",
           "WorkloadPriorityClass": "workloadpriorityclasses", "NetworkPolicy": "networkpolicies",
           "ResourceClaimTemplate": "resourceclaimtemplates", "ResourceClaim": "resourceclaims",
           "DeviceClass": "deviceclasses"}
JOBS = f"{GROUP}/{VERSION}"
log = logging.getLogger(__name__)


class _Metadata(msgspec.Struct):
    uid: str = ""
    resourceVersion: str = ""


class _Answer(msgspec.Struct):
    metadata: _Metadata = msgspec.field(default_factory=_Metadata)


# A create's or status write's answer is the whole object (a pod: 3-5 KB, a job: more); the
# operator reads its uid or resourceVersion, and decodes only that (watch/pod_events.py says why).
_answer = msgspec.json.Decoder(_Answer)
_uid_page = msgspec.json.Decoder(Page[_Answer])
# Pods per page of the resync's uid list. Each pod's metadata is 1-3 KB with its managedFields.
UID_PAGE = 500


class NamespaceTerminating(Exception):
    """The API server refused a create: the namespace is being deleted (403, NamespaceTerminating)."""


class Refused(Exception):
    """The API server's admission refused a create (403): a quota, a missing PriorityClass, a
    PodSecurity level, a webhook. Its message is the API server's."""


class NotServed(Refused):
    """A create's 404: a kind not served (an upgrade removed its version, a CRD gone), or no namespace."""


class Conflict(Exception):
    """The object changed since we read it: reconcile again from the newer version."""


class Invalid(Exception):
    """The API server rejected an object as invalid (422) or undecodable (400); the message says why."""


def object_path(obj: Mapping[str, Any], subresource: str | None = None, *, named: bool = True) -> str:
    meta = obj["metadata"]
    return path(str(obj["apiVersion"]), PLURALS[obj["kind"]], meta.get("namespace"),
                meta["name"] if named else None, subresource)


def event_body(namespace: str, name: str, uid: str, event_type: str, reason: str, message: str, instance: str,
               now: str) -> dict[str, Any]:
    """A core/v1 Event about the job, its message cut to 1 KiB."""
    return {"apiVersion": "v1", "kind": "Event", "metadata": {"generateName": f"{name}.", "namespace": namespace},
            "involvedObject": {"apiVersion": API_VERSION, "kind": KIND, "name": name, "namespace": namespace,
                               "uid": uid},
            "type": event_type, "reason": reason, "message": message[:1024], "firstTimestamp": now,
            "lastTimestamp": now, "count": 1, "source": {"component": FIELD_MANAGER},
            "reportingComponent": f"{GROUP}/operator", "reportingInstance": instance}


class Kube:
    def __init__(self, rest: Rest) -> None:
        self.rest = rest
        self.instance = os.environ.get("POD_NAME") or socket.gethostname()

    async def close(self) -> None:
        await self.rest.close()

    async def create(self, obj: Mapping[str, Any]) -> str | None:
        """Create an object the job owns: its uid; None if one of that name already exists."""
        ns = obj["metadata"]["namespace"]
        log.debug("create %s %s/%s", obj["kind"], ns, obj["metadata"].get("name"))
        try:
            created = await self.rest.request("POST", object_path(obj, named=False), body=obj,
                                              params={"fieldManager": FIELD_MANAGER}, raw=True)
        except ApiError as err:
            if err.status == 409:
                return None
            # Invalid: 422, or a 400 that is no webhook's (a quantity "a lot" the CRD let through: fuzz).
            error = classify(err.status, err.body, err.reason)
            if error.kind is ErrorKind.NAMESPACE_TERMINATING:
                raise NamespaceTerminating(ns) from err
            if error.kind is ErrorKind.INVALID:
                raise Invalid(error.message) from err
            if error.kind in REFUSALS:
                raise Refused(error.describe()) from err
            if error.kind is ErrorKind.NOT_FOUND:  # never retried in silence (issue 31)
                kind = f"{obj['apiVersion']} {obj['kind']}"
                raise NotServed(f"not found: {kind} ({error.code}): {error.message}") from err
            raise
        return _answer.decode(created).metadata.uid

    async def pod_uids(self, namespace: str) -> set[str]:
        """The uids of the operator's pods in `namespace` now: their metadata, a page at a time,
        decoded for the uid alone. Listed whole and decoded whole, a namespace of 20,000 pods was
        one answer of some 50 MB that `json.loads` made into several hundred MB of dicts: the
        operator's RSS at `make bench`'s 20,000-pod step read 139, 218 and 513 MB in three runs,
        as the 5-minute resync fell (issue 25). The pages are one snapshot: a continue token
        lists at the first page's resourceVersion."""
        params = {"labelSelector": JOB_NAME_LABEL, "limit": str(UID_PAGE)}
        accept = PARTIAL_METADATA.replace("PartialObjectMetadata", "PartialObjectMetadataList")
        uids: set[str] = set()
        async for page in list_pages(self.rest, path("v1", "pods", namespace), params, _uid_page.decode,
                                     lambda page: page.metadata.continue_, accept=accept):
            uids.update(item.metadata.uid for item in page.items or ())
        return uids

    async def namespace_terminating(self, namespace: str) -> bool | None:
        """True if the namespace is being deleted (or is gone), False if active, None if we may not ask."""
        try:
            found = await self.rest.request("GET", path("v1", "namespaces", name=namespace))
        except ApiError as err:
            if err.status in (403, 404):
                return None if err.status == 403 else True
            raise
        return bool(found["metadata"].get("deletionTimestamp")) or (found.get("status") or {}).get(
            "phase") == "Terminating"

    async def get(self, obj: Mapping[str, Any]) -> dict[str, Any] | None:
        """The object of `obj`'s kind, namespace and name as the API server has it; None if absent.
        Read when a create finds the name taken (who controls it?) and for a Volcano group's phase."""
        try:
            found: dict[str, Any] = await self.rest.request("GET", object_path(obj))
        except ApiError as err:
            if err.status == 404:
                return None
            raise
        return found

    async def list_cluster(self, api_version: str, kind: str) -> list[dict[str, Any]]:
        """Every object of a cluster-scoped kind (DeviceClasses: a handful); none if the API isn't served."""
        try:
            found: dict[str, Any] = await self.rest.request("GET", path(api_version, PLURALS[kind]))
        except ApiError as err:
            if err.status == 404:
                return []
            raise
        return list(found.get("items") or [])

    async def get_metadata(self, obj: Mapping[str, Any]) -> dict[str, Any] | None:
        """Only the object's metadata (a PartialObjectMetadata read; None if absent): whose it is,
        without a Secret's key material ever reaching the operator."""
        try:
            found = await self.rest.request("GET", object_path(obj), accept=PARTIAL_METADATA)
        except ApiError as err:
            if err.status == 404:
                return None
            raise
        return dict(found.get("metadata") or {})

    async def delete(self, obj: Mapping[str, Any], uid: str) -> None:
        """Delete exactly this object (uid precondition) of a kind the job owns; gone already is fine."""
        await self._delete(object_path(obj), uid)

    async def _delete(self, url_path: str, uid: str) -> None:
        body = {"preconditions": {"uid": uid}, "propagationPolicy": "Background"}
        try:
            await self.rest.request("DELETE", url_path, body=body)
        except ApiError as err:
            if err.status not in (404, 409):
                raise

    async def patch(self, obj: Mapping[str, Any], body: Mapping[str, Any], *, status: bool = False,
                    apply: bool = False, manager: str = FIELD_MANAGER) -> None:
        """Patch a namespaced custom object (or its status): a JSON merge patch, or with `apply` a
        forced server-side apply as `manager`. Conflict: a resourceVersion in the body no longer
        matches."""
        params = {"fieldManager": manager, **({"force": "true"} if apply else {})}
        try:
            await self.rest.request("PATCH", object_path(obj, "status" if status else None), body=dict(body),
                                    params=params, content_type=APPLY_PATCH if apply else MERGE_PATCH)
        except ApiError as err:
            if err.status == 409:
                raise Conflict(obj["metadata"]["name"]) from err
            if err.status != 404:
                raise

    async def json_patch(self, obj: Mapping[str, Any], operations: list[Mapping[str, Any]]) -> None:
        """A JSON patch (RFC 6902) of a namespaced custom object; Conflict when one of its `test`
        operations fails (the API server answers 422) or the object changed (409)."""
        try:
            await self.rest.request("PATCH", object_path(obj), body=list(operations),
                                    params={"fieldManager": FIELD_MANAGER}, content_type=JSON_PATCH)
        except ApiError as err:
            if err.status in (409, 422) and (err.status == 409 or "test" in err.message):
                raise Conflict(obj["metadata"]["name"]) from err
            if err.status != 404:
                raise

    async def served_group_versions(self) -> set[str]:
        """Every group/version the API server serves (discovery): which gang APIs exist here."""
        groups = await self.rest.request("GET", "/apis")
        return {v["groupVersion"] for g in groups.get("groups") or () for v in g.get("versions") or ()}

    async def patch_config_map_data(self, obj: Mapping[str, Any]) -> bool:
        """Merge-patch a ConfigMap's data with ours (a key someone else added stays); False if absent."""
        try:
            await self.rest.request("PATCH", object_path(obj), body={"data": obj["data"]},
                                    params={"fieldManager": FIELD_MANAGER}, content_type=MERGE_PATCH)
        except ApiError as err:
            if err.status == 404:
                return False
            raise
        return True

    async def annotate_pod(self, namespace: str, name: str, uid: str, annotations: dict[str, str]) -> bool:
        """Merge-patch the pod's annotations; its uid in the patch is a precondition (a newer pod of
        the name is left alone: 409). False if the pod is gone or is another."""
        body = {"metadata": {"uid": uid, "annotations": annotations}}
        try:
            await self.rest.request("PATCH", path("v1", "pods", namespace, name), body=body,
                                    params={"fieldManager": FIELD_MANAGER}, content_type=MERGE_PATCH)
        except ApiError as err:
            if err.status in (404, 409):
                return False
            raise
        return True

    async def delete_pod(self, namespace: str, name: str, uid: str) -> None:
        """Delete exactly the pod we judged (uid precondition): never a newer one of the same name."""
        log.debug("delete Pod %s/%s (uid %s)", namespace, name, uid)
        await self._delete(path("v1", "pods", namespace, name), uid)

    async def patch_job_status(
        self, namespace: str, name: str, status: Mapping[str, Any], resource_version: str | None
    ) -> dict[str, Any]:
        """Merge-patch the job's status; the answer's metadata.resourceVersion, the one this write made."""
        body: dict[str, Any] = {"status": dict(status)}
        if resource_version:
            # Optimistic concurrency: a status computed from a stale read is refused, not written.
            body["metadata"] = {"resourceVersion": resource_version}
        try:
            answer = await self.rest.request("PATCH", path(JOBS, PLURAL, namespace, name, "status"), body=body,
                                             params={"fieldManager": FIELD_MANAGER}, content_type=MERGE_PATCH,
                                             raw=True)
        except ApiError as err:
            if err.status == 409:
                raise Conflict(name) from err
            raise
        return {"metadata": {"resourceVersion": _answer.decode(answer).metadata.resourceVersion}}

    async def token_review(self, token: str, audiences: list[str]) -> dict[str, Any]:
        """The API server's word on a token (a TokenReview's status: authenticated, user, audiences).
        The token is in the request's body only: nothing here logs it."""
        answer = await self.rest.request("POST", "/apis/authentication.k8s.io/v1/tokenreviews", body={
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
            "spec": {"token": token, "audiences": audiences}})
        return dict(answer.get("status") or {})

    async def delete_job(self, namespace: str, name: str, uid: str) -> None:
        await self._delete(path(JOBS, PLURAL, namespace, name), uid)

    async def post_event(
        self, namespace: str, name: str, uid: str, event_type: str, reason: str, message: str
    ) -> None:
        event = event_body(namespace, name, uid, event_type, reason, message, self.instance,
                           timestamp(datetime.datetime.now(datetime.UTC)))
        await self.rest.request("POST", path("v1", "events", namespace), body=event)
