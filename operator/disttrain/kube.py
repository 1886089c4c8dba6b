"""The few API writes the operator makes, over kubernetes_asyncio, with errors sorted into
what reconciling needs to know: already there, gone, conflict, invalid."""

from __future__ import annotations

import datetime
import json
import logging
import os
import socket
from collections.abc import Mapping
from typing import Any

from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from disttrain.api_errors import REFUSALS, ErrorKind, classify
from disttrain.constants import API_VERSION, FIELD_MANAGER, GROUP, JOB_NAME_LABEL, KIND, PLURAL, VERSION
from disttrain.status import timestamp
from disttrain.teardown import NamespaceTerminating

MERGE_PATCH = "application/merge-patch+json"
# The core/v1 kinds a job owns, and their names in the client's method names.
_CORE_KINDS = {"Pod": "pod", "Service": "service", "ConfigMap": "config_map", "Secret": "secret"}
# The other kinds it writes or reads (a gang's group, Kueue's Workload, flavors and priorities):
# their plural resource names. ResourceFlavor and WorkloadPriorityClass are cluster-scoped.
_PLURALS = {"Workload": "workloads", "PodGroup": "podgroups", "ResourceFlavor": "resourceflavors",
            "WorkloadPriorityClass": "workloadpriorityclasses", "NetworkPolicy": "networkpolicies"}
APPLY_PATCH = "application/apply-patch+yaml"
PARTIAL_METADATA = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
log = logging.getLogger(__name__)


class Refused(Exception):
    """The API server's admission refused a create (403): a quota, a missing PriorityClass, a
    PodSecurity level, a webhook. Its message is the API server's."""


class Conflict(Exception):
    """The object changed since we read it: reconcile again from the newer version."""


class Invalid(Exception):
    """The API server rejected an object as invalid (422) or undecodable (400); the message says why."""


async def new_api_client(max_connections: int = 64) -> client.ApiClient:
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config()  # type: ignore[no-untyped-call]
        configuration = client.Configuration.get_default_copy()
    else:
        configuration = client.Configuration()
        await config.load_kube_config(client_configuration=configuration)
    configuration.connection_pool_maxsize = max_connections
    api_client = client.ApiClient(configuration)
    _skip_proxy_lookup(api_client)
    return api_client


PROXY_ENV = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "NETRC")


def _skip_proxy_lookup(api_client: client.ApiClient) -> None:
    """kubernetes_asyncio opens its aiohttp session with trust_env=True: every request then looks
    for proxy variables and reads ~/.netrc, in a thread (3% of the operator's CPU in a burst,
    profiled with `make bench --profile`). Where no such variable is set that finds nothing, so
    skip it; a kubeconfig's proxy-url still applies (it is the client's `proxy`, not the env)."""
    if any(os.environ.get(v) or os.environ.get(v.lower()) for v in PROXY_ENV):
        return
    session = getattr(api_client.rest_client, "pool_manager", None)
    if session is not None and hasattr(session, "_trust_env"):
        session._trust_env = False


class Kube:
    def __init__(self, api_client: client.ApiClient) -> None:
        self.api_client = api_client
        # Typed as Any: we send plain dicts, not the client's models (see builders.py).
        self.core: Any = client.CoreV1Api(api_client)
        self.custom: Any = client.CustomObjectsApi(api_client)
        self.instance = os.environ.get("POD_NAME") or socket.gethostname()

    async def close(self) -> None:
        await self.api_client.close()

    async def create(self, obj: Mapping[str, Any]) -> str | None:
        """Create an object the job owns: its uid; None if one of that name already exists."""
        ns, kind = obj["metadata"]["namespace"], obj["kind"]
        log.debug("create %s %s/%s", kind, ns, obj["metadata"].get("name"))
        try:
            if kind in _CORE_KINDS:
                # The raw response, decoded as plain JSON: building the client's model of the
                # created pod cost 8% of the operator's CPU in a burst (profiled).
                resp = await getattr(self.core, f"create_namespaced_{_CORE_KINDS[kind]}")(
                    ns, obj, field_manager=FIELD_MANAGER, _preload_content=False)
                created = json.loads(await _read_checked(resp))
            else:
                created = await self.custom.create_namespaced_custom_object(
                    *_group_version(obj), ns, _PLURALS[kind], obj, field_manager=FIELD_MANAGER)
        except ApiException as err:
            if err.status == 409:
                return None
            # Invalid: 422, or a 400 that is no webhook's (a quantity "a lot" the CRD let through: fuzz).
            error = classify(err.status, err.body, err.reason or "")
            if error.kind is ErrorKind.NAMESPACE_TERMINATING:
                raise NamespaceTerminating(ns) from err
            if error.kind is ErrorKind.INVALID:
                raise Invalid(error.message) from err
            if error.kind in REFUSALS:
                raise Refused(error.describe()) from err
            raise
        return str(created["metadata"]["uid"])

    async def pod_uids(self, namespace: str) -> set[str]:
        """The uids of the operator's pods in `namespace` now (a raw list: only the uids are read)."""
        resp = await self.core.list_namespaced_pod(namespace, label_selector=JOB_NAME_LABEL, _preload_content=False)
        return {p["metadata"]["uid"] for p in json.loads(await _read_checked(resp))["items"]}

    async def namespace_terminating(self, namespace: str) -> bool | None:
        """True if the namespace is being deleted (or is gone), False if active, None if we may not ask."""
        try:
            found = await self.core.read_namespace(namespace)
        except ApiException as err:
            if err.status in (403, 404):
                return None if err.status == 403 else True
            raise
        return found.metadata.deletion_timestamp is not None or found.status.phase == "Terminating"

    async def get(self, obj: Mapping[str, Any]) -> dict[str, Any] | None:
        """The object of `obj`'s kind, namespace and name as the API server has it; None if absent.
        Read when a create finds the name taken (who controls it?) and for a Volcano group's phase."""
        meta, kind = obj["metadata"], obj["kind"]
        try:
            if kind in _CORE_KINDS:
                read = getattr(self.core, f"read_namespaced_{_CORE_KINDS[kind]}")
                found = await read(meta["name"], meta["namespace"])
                result: dict[str, Any] = self.api_client.sanitize_for_serialization(found)
                return result
            if "namespace" not in meta:
                got: dict[str, Any] = await self.custom.get_cluster_custom_object(
                    *_group_version(obj), _PLURALS[kind], meta["name"])
            else:
                got = await self.custom.get_namespaced_custom_object(
                    *_group_version(obj), meta["namespace"], _PLURALS[kind], meta["name"])
            return got
        except ApiException as err:
            if err.status == 404:
                return None
            raise

    async def get_metadata(self, obj: Mapping[str, Any]) -> dict[str, Any] | None:
        """Only the object's metadata (a PartialObjectMetadata read; None if absent): whose it is,
        without a Secret's key material ever reaching the operator."""
        meta, version = obj["metadata"], str(obj["apiVersion"])
        plural = _PLURALS.get(obj["kind"]) or f"{obj['kind'].lower()}s"  # pods, services, configmaps, secrets
        base = f"/{'apis' if '/' in version else 'api'}/{version}/namespaces/{meta['namespace']}"
        path = f"{base}/{plural}/{meta['name']}"
        try:
            resp = await self.api_client.call_api(path, "GET", header_params={"Accept": PARTIAL_METADATA},
                                                  auth_settings=["BearerToken"], _preload_content=False)
            return dict(json.loads(await _read_checked(resp)).get("metadata") or {})
        except ApiException as err:
            if err.status == 404:
                return None
            raise

    async def delete(self, obj: Mapping[str, Any], uid: str) -> None:
        """Delete exactly this object (uid precondition) of a kind the job owns; gone already is fine."""
        meta, kind = obj["metadata"], obj["kind"]
        body = {"preconditions": {"uid": uid}, "propagationPolicy": "Background"}
        try:
            if kind in _CORE_KINDS:
                await getattr(self.core, f"delete_namespaced_{_CORE_KINDS[kind]}")(meta["name"], meta["namespace"],
                                                                                   body=body)
            else:
                await self.custom.delete_namespaced_custom_object(*_group_version(obj), meta["namespace"],
                                                                  _PLURALS[kind], meta["name"], body=body)
        except ApiException as err:
            if err.status not in (404, 409):
                raise

    async def patch(self, obj: Mapping[str, Any], body: Mapping[str, Any], *, status: bool = False,
                    apply: bool = False) -> None:
        """Patch a namespaced custom object (or its status): a JSON merge patch, or with `apply` a
        forced server-side apply as the operator's field manager. Conflict: a resourceVersion in
        the body no longer matches."""
        meta = obj["metadata"]
        patch = (self.custom.patch_namespaced_custom_object_status if status
                 else self.custom.patch_namespaced_custom_object)
        options: dict[str, Any] = {"field_manager": FIELD_MANAGER,
                                   "_content_type": APPLY_PATCH if apply else MERGE_PATCH}
        if apply:
            options["force"] = True
        try:
            await patch(*_group_version(obj), meta["namespace"], _PLURALS[obj["kind"]], meta["name"], dict(body),
                        **options)
        except ApiException as err:
            if err.status == 409:
                raise Conflict(meta["name"]) from err
            if err.status != 404:
                raise

    async def served_group_versions(self) -> set[str]:
        """Every group/version the API server serves (discovery): which gang APIs exist here."""
        groups = await client.ApisApi(self.api_client).get_api_versions()
        return {v.group_version for g in groups.groups for v in g.versions}

    async def patch_config_map_data(self, obj: Mapping[str, Any]) -> bool:
        """Merge-patch a ConfigMap's data with ours (a key someone else added stays); False if absent."""
        meta = obj["metadata"]
        try:
            await self.core.patch_namespaced_config_map(meta["name"], meta["namespace"], {"data": obj["data"]},
                                                        field_manager=FIELD_MANAGER)
        except ApiException as err:
            if err.status == 404:
                return False
            raise
        return True

    async def delete_pod(self, namespace: str, name: str, uid: str) -> None:
        """Delete exactly the pod we judged (uid precondition): never a newer one of the same name."""
        log.debug("delete Pod %s/%s (uid %s)", namespace, name, uid)
        body = {"preconditions": {"uid": uid}, "propagationPolicy": "Background"}
        try:
            await self.core.delete_namespaced_pod(name, namespace, body=body)
        except ApiException as err:
            if err.status not in (404, 409):
                raise

    async def patch_job_status(
        self, namespace: str, name: str, status: Mapping[str, Any], resource_version: str | None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"status": dict(status)}
        if resource_version:
            # Optimistic concurrency: a status computed from a stale read is refused, not written.
            body["metadata"] = {"resourceVersion": resource_version}
        try:
            result: dict[str, Any] = await self.custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, namespace, PLURAL, name, body, field_manager=FIELD_MANAGER, _content_type=MERGE_PATCH,
            )
        except ApiException as err:
            if err.status == 409:
                raise Conflict(name) from err
            raise
        return result

    async def delete_job(self, namespace: str, name: str, uid: str) -> None:
        body = {"preconditions": {"uid": uid}, "propagationPolicy": "Background"}
        try:
            await self.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, body=body)
        except ApiException as err:
            if err.status not in (404, 409):
                raise

    async def post_event(
        self, namespace: str, name: str, uid: str, event_type: str, reason: str, message: str
    ) -> None:
        now = timestamp(datetime.datetime.now(datetime.UTC))
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{name}.", "namespace": namespace},
            "involvedObject": {"apiVersion": API_VERSION, "kind": KIND, "name": name, "namespace": namespace,
                               "uid": uid},
            "type": event_type,
            "reason": reason,
            "message": message[:1024],
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "source": {"component": FIELD_MANAGER},
            "reportingComponent": f"{GROUP}/operator",
            "reportingInstance": self.instance,
        }
        await self.core.create_namespaced_event(namespace, event)


def _group_version(obj: Mapping[str, Any]) -> tuple[str, str]:
    group, version = str(obj["apiVersion"]).split("/")
    return group, version


async def _read_checked(resp: Any) -> bytes:
    """A raw (aiohttp) response's body; for an error, what the client raises for one it reads itself."""
    async with resp:
        data = await resp.read()
        if resp.status < 300:
            return bytes(data)
        err = ApiException(status=resp.status, reason=resp.reason)
        err.body, err.headers = data.decode("utf-8", "replace"), resp.headers
        raise err

