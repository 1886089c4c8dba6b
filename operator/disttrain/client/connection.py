"""Reaching the API server from a laptop, a notebook or a pod, with the synchronous `kubernetes`
client: a notebook's kernel already runs an event loop, where `asyncio.run` can't be called.

Like kubectl: an explicit kubeconfig, else $KUBECONFIG or ~/.kube/config, else the pod's own
ServiceAccount (in-cluster). The namespace: the one asked for, else the kubeconfig context's,
else the pod's, else `default`."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import urllib3
import yaml
from kubernetes import client, config

from disttrain.api.constants import GROUP, PLURAL, VERSION

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


class ConnectError(Exception):
    """The kubeconfig can't say how to reach the API server; the message says which and why."""


def connect(kubeconfig: str | None = None, context: str | None = None) -> tuple[client.ApiClient, str]:
    """An API client and the namespace it defaults to; ConnectError if the kubeconfig is missing or
    malformed, or has no such context."""
    path = kubeconfig or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or \
        os.path.expanduser(config.KUBE_CONFIG_DEFAULT_LOCATION)
    if kubeconfig or context or os.path.exists(path) or not os.environ.get("KUBERNETES_SERVICE_HOST"):
        return _from_kubeconfig(path, context, given=bool(kubeconfig))
    configuration = client.Configuration()
    config.load_incluster_config(client_configuration=configuration)
    namespace = SERVICE_ACCOUNT_NAMESPACE.read_text().strip() if SERVICE_ACCOUNT_NAMESPACE.exists() else "default"
    return client.ApiClient(configuration), namespace


def _from_kubeconfig(path: str, context: str | None, given: bool) -> tuple[client.ApiClient, str]:
    if not os.path.isfile(path):
        raise ConnectError(f"--kubeconfig {path}: missing" if given else f"no kubeconfig: {path} is missing (set "
                           "$KUBECONFIG or --kubeconfig, or run in a pod)")
    try:
        contexts, active = config.list_kube_config_contexts(config_file=path)
    except (config.ConfigException, yaml.YAMLError, TypeError, AttributeError, KeyError) as err:
        problem = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ConnectError(f"{path}: a malformed kubeconfig ({problem})") from err
    chosen = next((c for c in contexts if c["name"] == context), None) if context else active
    if context and chosen is None:
        raise ConnectError(f"{path}: no context {context!r} (it has {', '.join(c['name'] for c in contexts)})")
    try:
        api = config.new_client_from_config(config_file=path, context=context, persist_config=False)
    except (config.ConfigException, TypeError, AttributeError, KeyError) as err:
        raise ConnectError(f"{path}: a malformed kubeconfig ({err})") from err
    return api, ((chosen or {}).get("context") or {}).get("namespace") or "default"


def unreachable(err: urllib3.exceptions.HTTPError) -> str:
    """A request that never got an answer, in one line."""
    pool = getattr(err, "pool", None)
    where = f" at {pool.host}:{pool.port}" if pool is not None else ""
    reason = str(getattr(err, "reason", None) or err)
    return f"can't reach the API server{where}: {reason.rpartition('>: ')[2]}"


class LogUnavailable(Exception):
    """The API server would not give a container's log; the message is its own."""


def api_message(err: client.ApiException) -> str:
    try:
        return str(json.loads(err.body)["message"])
    except (TypeError, ValueError, KeyError):
        return f"{err.status} {err.reason}"


class LogResponse:
    """A pod log as the API server streams it: chunks as they arrive; close() hangs up."""

    def __init__(self, response: Any) -> None:
        self.response = response

    def __iter__(self) -> Iterator[bytes]:
        # stream() hands out each chunk of a chunked (follow) response as it arrives.
        yield from self.response.stream(64 * 1024, decode_content=True)

    def close(self) -> None:
        self.response.close()


class KubeLogSource:
    """`disttrain.client.joblogs.LogSource` over the API server."""

    def __init__(self, api: client.ApiClient) -> None:
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)

    def job(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        try:
            found: Mapping[str, Any] = self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL,
                                                                                 name)
        except client.ApiException as err:
            if err.status == 404:
                return None
            raise
        return found

    def pods(self, namespace: str, label_selector: str) -> list[Mapping[str, Any]]:
        # The raw JSON (the API's own shape), not the client's models.
        response = self.core.list_namespaced_pod(namespace, label_selector=label_selector, _preload_content=False)
        return list(json.loads(response.data)["items"])

    def log(self, namespace: str, pod: str, container: str, *, follow: bool, previous: bool) -> LogResponse:
        try:
            response = self.core.read_namespaced_pod_log(pod, namespace, container=container, follow=follow,
                                                         previous=previous, _preload_content=False)
        except client.ApiException as err:
            raise LogUnavailable(api_message(err)) from err
        return LogResponse(response)
