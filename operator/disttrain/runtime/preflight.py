"""What the operator checks once at start-up: the Kubernetes version it needs, and that the API
server serves its CRD.

The CRD's validation rules (CEL, with `reason` and `fieldPath`) and the server-side apply the
operator writes with are served from Kubernetes 1.30. The Helm chart can't insist on that when it
is rendered offline (helm template, GitOps tools: helm's placeholder version is v1.20), so the
operator says it instead, before doing anything, in a line that names both versions."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Mapping
from typing import Any

from disttrain.api.constants import GROUP, PLURAL, VERSION
from disttrain.api.crd import job_schema
from disttrain.apiserver.rest import ApiError, Endpoint, Rest

MINIMUM = (1, 30)
# The minors `make test` (1.36) and `make test-matrix` (1.37) run the integration suite on; outside
# them the operator starts, and says so once (README, "Kubernetes versions").
TESTED = ((1, 36), (1, 37))


def server_version(info: Mapping[str, str]) -> tuple[int, int] | None:
    """(major, minor) of an API server's /version answer; None if it can't be read. Managed
    clusters write minor as "29+" (GKE, EKS): the digits count."""
    major = re.match(r"\d+", str(info.get("major", "")))
    minor = re.match(r"\d+", str(info.get("minor", "")))
    if major and minor:
        return int(major.group()), int(minor.group())
    found = re.match(r"v?(\d+)\.(\d+)", str(info.get("gitVersion", "")))
    return (int(found.group(1)), int(found.group(2))) if found else None


def version_problem(info: Mapping[str, str]) -> str | None:
    """Why the operator can't run against this API server, or None if it can."""
    version = server_version(info)
    if version is None or version >= MINIMUM:
        return None  # an unreadable version is let through: the API calls will say more than we can
    return (f"disttrain needs Kubernetes {MINIMUM[0]}.{MINIMUM[1]} or later (CRD validation rules in CEL, "
            f"server-side apply); this API server runs {info.get('gitVersion') or '.'.join(map(str, version))}")


def version_note(info: Mapping[str, str]) -> str | None:
    """A supported version this release was not tested on (a warning at start-up), or None."""
    version = server_version(info)
    if version is None or TESTED[0] <= version <= TESTED[-1]:
        return None
    tested = ", ".join(f"{major}.{minor}" for major, minor in TESTED)
    return (f"this API server runs Kubernetes {info.get('gitVersion') or '.'.join(map(str, version))}; this "
            f"release of disttrain was tested on {tested}"
            + (" (Kubernetes' own gang scheduling, runPolicy.scheduling.gang provider Kubernetes, needs 1.36 or "
               "later)" if version < TESTED[0] else ""))


async def check_kubernetes_version(login: Callable[[], Endpoint]) -> tuple[str | None, str | None]:
    """Ask the API server its version: (the problem, if it is too old; a note, if it is untested)."""
    async with Rest(login, max_connections=1) as rest:
        info = await rest.request("GET", "/version")
    return version_problem(info), version_note(info)


async def wait_for_crd(log: Any, login: Callable[[], Endpoint], interval: float = 1.0) -> None:
    """Until the API server serves DistTrainJobs, with a status schema that has every field this
    operator writes. A watch of a resource not yet served fails until it is (when kopf followed jobs,
    it resolved its resources once at its start and never picked up a CRD established a moment
    later: an operator started right after `kubectl apply` of the CRD never reconciled a job). And
    `helm upgrade` never updates a chart's CRDs: under an older schema the API server prunes the status
    fields it doesn't know (status.sshSecret, status.elastic.leaving), and a job's status would lose
    what its next pass reads (issue 31's review); and the spec fields a user writes
    (spec.mpi.bootstrap), silently. The operator waits, not Ready, saying what to apply,
    rather than run on it (the README's upgrade steps apply the CRD first)."""
    async with Rest(login, max_connections=2) as rest:
        said: set[str] = set()
        while True:
            problem = await _crd_problem(rest)
            if problem is None:
                return
            if problem not in said:
                (log.error if "older" in problem else log.warning)(problem)
                said.add(problem)
            await asyncio.sleep(interval)


async def _crd_problem(rest: Rest) -> str | None:
    try:
        found = await rest.request("GET", f"/apis/{GROUP}/{VERSION}")
        if not any(r.get("name") == PLURAL for r in found.get("resources") or ()):
            raise ApiError(404, "not served")
        listed = await rest.request("GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                                    params={"fieldSelector": f"metadata.name={PLURAL}.{GROUP}"})
    except ApiError as err:
        if err.status not in (403, 404, 503):
            raise
        return f"waiting for the API server to serve {PLURAL}.{GROUP}/{VERSION} (is the CRD installed?)"
    served = next((v for crd in listed.get("items") or () for v in crd["spec"]["versions"] if v["name"] == VERSION),
                  None)
    schema = ((served or {}).get("schema") or {}).get("openAPIV3Schema") or {}
    ours, theirs = job_schema()["properties"], schema.get("properties") or {}
    missing = [field for part in ("spec", "status")
               for field in missing_fields(ours[part], theirs.get(part) or {}, part)]
    if not missing:
        return None
    return (f"the DistTrainJob CRD installed is older than this operator (its schema has no {', '.join(missing)}): "
            f"apply this release's CRD (`kubectl apply --server-side -f crds/disttrainjobs.disttrain.dev.yaml`; "
            f"`helm upgrade` doesn't update CRDs). Waiting for it")


def missing_fields(ours: Mapping[str, Any], served: Mapping[str, Any], where: str) -> list[str]:
    """The object fields of `ours` (an OpenAPI schema) that `served` lacks, as dotted paths."""
    if served.get("x-kubernetes-preserve-unknown-fields"):
        return []
    theirs = served.get("properties") or {}
    missing = []
    for name, field in (ours.get("properties") or {}).items():
        if name not in theirs:
            missing.append(f"{where}.{name}")
        elif field.get("type") == "object":
            missing += missing_fields(field, theirs[name], f"{where}.{name}")
    return missing
