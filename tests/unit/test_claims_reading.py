"""What the controller reads of an MPI job's DRA claims (control/claims.py): each claim object once,
the GPU device classes at most once a minute, and the worker's slots from them."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import gc
import json
import tracemalloc
from collections.abc import Mapping
from typing import Any

import pytest
from fakes import FakeClock
from test_claims import EXAMPLE, NVIDIA, exactly, spec

from disttrain.api.objects import JobRef
from disttrain.api.observed import ObservedPod
from disttrain.api.parse import parse_spec
from disttrain.api.spec import Elastic
from disttrain.builders.mpi import slots_per_worker
from disttrain.control.claims import Claims
from disttrain.decide.passes import JobState
from manifests import job, replica


class Reads:
    def __init__(self, objects: dict[tuple[str, str], dict[str, Any]]) -> None:
        self.objects, self.calls = objects, []  # type: ignore[var-annotated]

    async def get(self, obj: Mapping[str, Any]) -> dict[str, Any] | None:
        self.calls.append(("get", obj["kind"], obj["metadata"]["name"]))
        found = self.objects.get((obj["kind"], obj["metadata"]["name"]))
        return copy.deepcopy(found) if found else None

    async def list_cluster(self, api_version: str, kind: str) -> list[dict[str, Any]]:
        self.calls.append(("list", kind, ""))
        return [NVIDIA, EXAMPLE]


def mpi_with_claims(workers: int, *claims: dict[str, Any], slots: int | None = None,
                    status: dict[str, Any] | None = None, uid: str = "uid-1") -> JobState:
    worker = replica(workers, "ExitCode", cpu="1")
    worker["template"]["spec"]["resourceClaims"] = list(claims)
    # the rank container is given each claim whole (a container sees only the claims it names)
    worker["template"]["spec"]["containers"][0].setdefault("resources", {})["claims"] = [
        {"name": c["name"]} for c in claims if isinstance(c.get("name"), str)]
    mpi: dict[str, Any] = {"launcher": replica(1, "Never", command=["mpirun", "python", "/train.py"]),
                           "worker": worker}
    if slots is not None:
        mpi["slotsPerWorker"] = slots
    return JobState(JobRef("hvd", "ml", uid), 1, parse_spec(job("hvd", {"mpi": mpi})["spec"]), status or {})


# A worker pod of the job uid-1 (mpi_with_claims's), as the pod watch indexes it.
OWN = [ObservedPod(name="hvd-worker-0", uid="pod-1", owner_uid="uid-1", replica_type="worker", index=0,
                   phase="Running", ready=True, terminating=False, exit_code=None, reason=None, container_restarts=0)]
TWO = {"spec": {"spec": spec({"exactly": exactly("gpu.example.com", 2)})}}


def test_a_workers_slots_are_the_gpus_its_claim_template_allocates() -> None:
    reads = Reads({("ResourceClaimTemplate", "two-gpus"): TWO})
    claims = Claims(reads, FakeClock(), gpu_classes=["gpu.example.com"])
    state = mpi_with_claims(4, {"name": "gpus", "resourceClaimTemplateName": "two-gpus"})
    seen = asyncio.run(claims.observe(state, []))
    assert seen.claims.gpus == 2 and seen.spec.mpi is not None and slots_per_worker(seen.spec.mpi) == 2
    assert reads.calls == [("list", "DeviceClass", ""), ("get", "ResourceClaimTemplate", "two-gpus")]
    kept = mpi_with_claims(4, {"name": "gpus", "resourceClaimTemplateName": "two-gpus"},
                           status={"claimedGPUsPerWorker": 2})
    assert asyncio.run(claims.observe(kept, [])).claims.gpus == 2
    assert len(reads.calls) == 2, "counted once: the status keeps it"


def test_explicit_slots_read_nothing_and_a_missing_template_is_waited_for() -> None:
    reads = Reads({})
    claims = Claims(reads, FakeClock())
    set_slots = mpi_with_claims(2, {"name": "gpus", "resourceClaimTemplateName": "two-gpus"}, slots=3)
    assert asyncio.run(claims.observe(set_slots, [])).claims.gpus is None and not reads.calls
    later = mpi_with_claims(2, {"name": "g", "resourceClaimTemplateName": "later"})
    missing = asyncio.run(claims.observe(later, []))
    assert missing.claims.missing == "ResourceClaimTemplate later"


def test_a_gpu_claim_shared_by_several_workers_is_refused_naming_it() -> None:
    reads = Reads({("ResourceClaim", "team"): {"spec": spec({"exactly": exactly("gpu.nvidia.com", 8)})}})
    shared = mpi_with_claims(2, {"name": "g", "resourceClaimName": "team"})
    reading = asyncio.run(Claims(reads, FakeClock()).observe(shared, [])).claims
    assert reading.trouble is not None and "ResourceClaim team allocates GPUs and is shared by all 2 workers" in \
        reading.trouble


def test_a_count_kept_in_the_status_stands_for_a_claim_object_deleted_since() -> None:
    """An operator restarted after the template was deleted still gives the running workers their slots."""
    claims = Claims(Reads({}), FakeClock())
    state = mpi_with_claims(4, {"name": "gpus", "resourceClaimTemplateName": "two-gpus"},
                            status={"phase": "Running", "claimedGPUsPerWorker": 2})
    seen = asyncio.run(claims.observe(state, []))
    assert seen.claims.gpus == 2 and seen.claims.missing is None
    assert seen.spec.mpi is not None and slots_per_worker(seen.spec.mpi) == 2
    forged = mpi_with_claims(4, {"name": "gpus", "resourceClaimTemplateName": "two-gpus"},
                             status={"claimedGPUsPerWorker": "lots"})
    assert asyncio.run(claims.observe(forged, [])).claims.missing == "ResourceClaimTemplate two-gpus"


def test_each_job_reads_its_own_claim_objects_so_a_template_made_again_counts_anew() -> None:
    reads = Reads({("ResourceClaimTemplate", "two-gpus"): TWO})
    claims = Claims(reads, FakeClock(), gpu_classes=["gpu.example.com"])
    asyncio.run(claims.observe(mpi_with_claims(2, {"name": "g", "resourceClaimTemplateName": "two-gpus"}), []))
    reads.objects[("ResourceClaimTemplate", "two-gpus")] = {
        "spec": {"spec": spec({"exactly": exactly("gpu.example.com", 4)})}}
    again = mpi_with_claims(2, {"name": "g", "resourceClaimTemplateName": "two-gpus"}, uid="uid-2")
    assert asyncio.run(claims.observe(again, [])).claims.gpus == 4
    assert set(claims.counts) == {"uid-1", "uid-2"}
    kept = mpi_with_claims(2, {"name": "g", "resourceClaimTemplateName": "two-gpus"},
                           status={"claimedGPUsPerWorker": 2})
    asyncio.run(claims.observe(kept, OWN))
    assert set(claims.counts) == {"uid-2"}, "counted and kept in its status: the cache lets it go"
    claims.forget("uid-2")
    assert not claims.counts


def test_a_finished_job_reads_nothing() -> None:
    reads = Reads({})
    done = mpi_with_claims(2, {"name": "g", "resourceClaimTemplateName": "x"}, status={"phase": "Succeeded"})
    assert asyncio.run(Claims(reads, FakeClock()).observe(done, [])).claims.missing is None and not reads.calls


def test_a_running_job_keeps_its_count_whatever_happens_to_the_classes_and_one_counted_before_keeps_its_slots() -> None:
    """The hostfile its pods were built from stands: a DeviceClass gone or a template made again
    changes nothing while the job runs, and a job whose pods an older operator made is left as it was."""
    reads = Reads({("ResourceClaimTemplate", "two-gpus"): TWO})
    claims = Claims(reads, FakeClock())  # gpu.example.com is no GPU class now
    kept = mpi_with_claims(4, {"name": "gpus", "resourceClaimTemplateName": "two-gpus"},
                           status={"phase": "Running", "claimedGPUsPerWorker": 2})
    assert asyncio.run(claims.observe(kept, OWN)).claims.gpus == 2 and not reads.calls
    older = mpi_with_claims(4, {"name": "gpus", "resourceClaimTemplateName": "two-gpus"}, status={"phase": "Running"})
    seen = asyncio.run(claims.observe(older, OWN))
    assert seen.claims.gpus is None and seen.spec.mpi is not None and seen.spec.mpi.claimed_gpus is None
    assert not reads.calls
    # A new job's first pass makes its pods before it writes any status: its second still counts.
    first = mpi_with_claims(4, {"name": "gpus", "resourceClaimTemplateName": "two-gpus"})
    assert asyncio.run(Claims(reads, FakeClock(), ["gpu.example.com"]).observe(first, OWN)).claims.gpus == 2


def test_hostile_claim_entries_fail_the_job_without_a_request() -> None:
    """A name that would walk the request path, an empty one, both names: refused before any read."""
    reads = Reads({})
    for entry in ({"name": "g", "resourceClaimTemplateName": "../../other-team/resourceclaimtemplates/theirs"},
                  {"name": "g", "resourceClaimName": ""},
                  {"name": "g", "resourceClaimName": "a", "resourceClaimTemplateName": "b"},
                  {"name": "g", "resourceClaimTemplateName": "x" * 254}):
        seen = asyncio.run(Claims(reads, FakeClock()).observe(mpi_with_claims(2, entry), []))
        assert seen.claims.trouble is not None and "names no ResourceClaim or ResourceClaimTemplate" in \
            seen.claims.trouble, entry
    assert not reads.calls


def test_an_elastic_job_that_may_grow_past_one_worker_cant_share_a_gpu_claim() -> None:
    reads = Reads({("ResourceClaim", "team"): {"spec": spec({"exactly": exactly("gpu.nvidia.com", 1)})}})
    state = mpi_with_claims(1, {"name": "g", "resourceClaimName": "team"})
    assert state.spec.mpi is not None
    grows = dataclasses.replace(state, spec=dataclasses.replace(state.spec, mpi=dataclasses.replace(
        state.spec.mpi, elastic=Elastic(min_replicas=1, max_replicas=3))))
    seen = asyncio.run(Claims(reads, FakeClock()).observe(grows, []))
    assert "shared by all 3 workers" in str(seen.claims.trouble)


def test_the_stated_bounds_hold_bytes_kept_claims_read_and_a_status_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """At most MAX_KEPT_BYTES of counts are kept, the oldest job's let go first; at most MAX_CLAIMS
    of a template's entries are read; a status count past MAX_PER_WORKER is ignored; an earlier
    job's pods are not this job's."""
    from disttrain.api.constants import MAX_CLAIMS
    from disttrain.builders.claims import MAX_PER_WORKER
    from disttrain.control import claims as claims_module

    monkeypatch.setattr(claims_module, "MAX_KEPT_BYTES", 4096)
    reads = Reads({("ResourceClaimTemplate", "two-gpus"): TWO})
    claims = Claims(reads, FakeClock(), ["gpu.example.com"])
    waiting = [{"name": "g", "resourceClaimTemplateName": "two-gpus"},
               {"name": "later", "resourceClaimTemplateName": "not-there-yet"}]
    for i in range(100):
        asyncio.run(claims.observe(mpi_with_claims(2, *waiting, uid=f"uid-{i}"), []))
        assert claims.kept_bytes <= 4096
    assert "uid-0" not in claims.counts and "uid-99" in claims.counts, "the oldest let go"
    assert claims.kept_bytes == sum(c.size for job in claims.counts.values() for c in job.values())

    many = [{"name": f"c{i}", "resourceClaimTemplateName": f"t{i}"} for i in range(MAX_CLAIMS + 10)]
    reads.objects.update({("ResourceClaimTemplate", f"t{i}"): TWO for i in range(MAX_CLAIMS + 10)})
    reads.calls.clear()
    asyncio.run(Claims(reads, FakeClock()).observe(mpi_with_claims(2, *many, uid="many"), []))
    assert sum(1 for call in reads.calls if call[0] == "get") == MAX_CLAIMS

    entry = {"name": "g", "resourceClaimTemplateName": "two-gpus"}
    past = mpi_with_claims(2, entry, status={"phase": "Pending", "claimedGPUsPerWorker": MAX_PER_WORKER + 1})
    assert asyncio.run(claims.observe(past, [])).claims.gpus == 2, "ignored: counted again from the claims"
    earlier = [dataclasses.replace(OWN[0], owner_uid="an-earlier-job")]
    assert asyncio.run(claims.observe(mpi_with_claims(2, entry, status={"phase": "Pending"}), earlier)).claims.gpus == 2


class FreshReads(Reads):
    """Each get is a new object, as one parsed from the API server's answer is (a deep copy would
    share the strings, and keep nothing new to measure)."""

    async def get(self, obj: Mapping[str, Any]) -> dict[str, Any] | None:
        found = await super().get(obj)
        return json.loads(json.dumps(found)) if found else None


def test_a_job_waiting_on_a_claim_keeps_counts_not_the_megabytes_of_its_templates_specs() -> None:
    """31 templates of 1.3 MB each (32 requests x 4 CEL selectors of 10 KiB: within resource.k8s.io's
    limits) and one template not there: the job waits, and what is kept for it is bytes, not the
    specs. Before: three such jobs kept 125 MB (the issue saw the controller grow 57 -> 179 MB)."""
    selector = {"cel": {"expression": "device.attributes['x'].y == '" + "z" * 10_200 + "'"}}
    request = {"exactly": {**exactly("gpu.example.com", 1), "selectors": [selector] * 4}}
    huge = {"spec": {"spec": {"devices": {"requests": [
        {"name": f"r{i}", **request} for i in range(32)]}}}}
    assert len(json.dumps(huge)) > 1_300_000
    reads = FreshReads({("ResourceClaimTemplate", f"big-{i}"): huge for i in range(31)})
    claims = Claims(reads, FakeClock(), ["gpu.example.com"])
    entries = [{"name": f"c{i}", "resourceClaimTemplateName": f"big-{i}"} for i in range(31)]
    entries.append({"name": "missing", "resourceClaimTemplateName": "not-there"})
    gc.collect()
    tracemalloc.start()
    try:
        for job_index in range(3):
            seen = asyncio.run(claims.observe(mpi_with_claims(2, *entries, uid=f"uid-{job_index}"), []))
            assert seen.claims.missing == "ResourceClaimTemplate not-there"
        gc.collect()
        kept, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert kept < 2 << 20, f"{kept / 2**20:.1f} MiB kept for three waiting jobs"
    assert claims.kept_bytes < 3 * 31 * 32 * 200


def test_only_the_claims_and_requests_the_rank_container_names_count() -> None:
    """A template of two requests, `train` (1 GPU) and `extra` (2 GPUs), whose rank container names
    only `train`: one slot (before: 3, every request of every claim of the pod counted)."""
    two_requests = {"spec": {"spec": {"devices": {"requests": [
        {"name": "train", "exactly": exactly("gpu.example.com", 1)},
        {"name": "extra", "exactly": exactly("gpu.example.com", 2)}]}}}}
    reads = Reads({("ResourceClaimTemplate", "mixed"): two_requests, ("ResourceClaimTemplate", "two-gpus"): TWO})
    state = mpi_with_claims(2, {"name": "gpus", "resourceClaimTemplateName": "mixed"},
                            {"name": "sidecar-gpus", "resourceClaimTemplateName": "two-gpus"})
    state.spec.mpi.worker.template["spec"]["containers"][0]["resources"]["claims"] = [  # type: ignore[union-attr]
        {"name": "gpus", "request": "train"}]
    seen = asyncio.run(Claims(reads, FakeClock(), ["gpu.example.com"]).observe(state, []))
    assert seen.claims.gpus == 1, seen.claims
    state.spec.mpi.worker.template["spec"]["containers"][0]["resources"]["claims"] = [  # type: ignore[union-attr]
        {"name": "gpus"}, {"name": "gpus", "request": "extra"}]
    assert asyncio.run(Claims(reads, FakeClock(), ["gpu.example.com"]).observe(state, [])).claims.gpus == 3, \
        "the whole claim named, and one of its requests again: counted once"


def test_a_namespace_past_its_share_of_the_kept_counts_lets_its_own_jobs_go_first(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """One namespace's many waiting jobs fill the budget: its own oldest go, another tenant's stay
    (before, the oldest job of any namespace went, and every tenant's waiting jobs read again)."""
    from disttrain.control import claims as claims_module

    monkeypatch.setattr(claims_module, "MAX_KEPT_BYTES", 4096)
    monkeypatch.setattr(claims_module, "MAX_KEPT_BYTES_PER_NAMESPACE", 1024)
    reads = Reads({("ResourceClaimTemplate", "two-gpus"): TWO})
    claims = Claims(reads, FakeClock(), ["gpu.example.com"])
    waiting = [{"name": "g", "resourceClaimTemplateName": "two-gpus"},
               {"name": "later", "resourceClaimTemplateName": "not-there-yet"}]
    tenant = dataclasses.replace(mpi_with_claims(2, *waiting, uid="tenant"),
                                 ref=JobRef("hvd", "other-team", "tenant"))
    asyncio.run(claims.observe(tenant, []))
    for i in range(100):
        asyncio.run(claims.observe(mpi_with_claims(2, *waiting, uid=f"flood-{i}"), []))
    assert "tenant" in claims.counts, "the other namespace's counts stay"
    assert claims.kept_bytes <= 4096 and sum(claims.namespace_bytes.values()) == claims.kept_bytes
