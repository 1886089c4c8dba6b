"""Pod events decoded into only what `observe_pod` reads.

A pod's JSON is 3-5 KB (managed fields, the spec's containers, volumes, tolerations) and the
operator reads a tenth of it. msgspec decodes into the typed subset below and skips the rest
without building it: 4.6 us an event where `json.loads` of the whole took 23 us, and 15 us where
decoding and observing took 32 (a 3.5 KB pod event of `make bench`'s jobs, measured with timeit;
the whole-pod decode was 8% of the operator's CPU in a burst, profiled). The result is handed to
`observe_pod` as the plain dicts it reads (`to_builtins`, defaults left out, so a dict has the
keys the API server sent), which keeps one reading of a pod for the watch, the tests and the list.

A field added to `observe_pod` must be added here too: tests/unit/test_pod_events.py decodes a
full pod both ways and compares.
"""

from __future__ import annotations

from typing import Any

import msgspec

from disttrain.apiserver.wire import event_decoder, page_decoder


class _Subset(msgspec.Struct, omit_defaults=True):
    pass


class OwnerReference(_Subset):
    apiVersion: str = ""
    kind: str = ""
    name: str = ""
    uid: str = ""
    controller: bool | None = None


class Metadata(_Subset):
    name: str = ""
    namespace: str = ""
    uid: str = ""
    resourceVersion: str = ""
    labels: dict[str, str] | None = None
    ownerReferences: list[OwnerReference] | None = None
    deletionTimestamp: str | None = None


class Condition(_Subset):
    type: str = ""
    status: str = ""
    reason: str | None = None
    message: str | None = None
    lastTransitionTime: str | None = None


class Terminated(_Subset):
    exitCode: int | None = None  # not 0: a default is left out, and `{"exitCode": 0}` must stay truthy
    reason: str | None = None
    finishedAt: str | None = None


class Waiting(_Subset):
    reason: str | None = None
    message: str | None = None


class ContainerState(_Subset):
    terminated: Terminated | None = None
    waiting: Waiting | None = None


class ContainerStatus(_Subset):
    name: str = ""
    image: str = ""
    restartCount: int = 0
    state: ContainerState | None = None
    lastState: ContainerState | None = None


class PodStatus(_Subset):
    phase: str | None = None
    reason: str | None = None
    conditions: list[Condition] | None = None
    containerStatuses: list[ContainerStatus] | None = None
    initContainerStatuses: list[ContainerStatus] | None = None
    startTime: str | None = None


class PodSpec(_Subset):
    nodeName: str | None = None


class Pod(_Subset):
    metadata: Metadata | None = None
    spec: PodSpec | None = None
    status: PodStatus | None = None


def _as_dicts(pod: Pod) -> dict[str, Any]:
    built: dict[str, Any] = msgspec.to_builtins(pod)
    return built


# A watch line: its type and object (a pod's subset; a Status, whole, for ERROR). A list page: its
# pods (subsets), resourceVersion and continue token.
decode_event = event_decoder(Pod, _as_dicts)
decode_list = page_decoder(Pod, _as_dicts)
