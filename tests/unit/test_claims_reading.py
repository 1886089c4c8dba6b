"""What the controller reads of an MPI job's DRA claims (control/claims.py): each claim object once,
the GPU device classes at most once a minute, and the worker's slots from them."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
from collections.abc import Mapping
from typing import Any

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
    assert reads.calls == [("get", "ResourceClaimTemplate", "two-gpus"), ("list", "DeviceClass", "")]
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
    assert set(claims.specs) == {"uid-1", "uid-2"}
    kept = mpi_with_claims(2, {"name": "g", "resourceClaimTemplateName": "two-gpus"},
                           status={"claimedGPUsPerWorker": 2})
    asyncio.run(claims.observe(kept, OWN))
    assert set(claims.specs) == {"uid-2"}, "counted and kept in its status: the cache lets it go"
    claims.forget("uid-2")
    assert not claims.specs


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


def test_the_stated_bounds_hold_jobs_kept_claims_read_and_a_status_count() -> None:
    """At most MAX_JOBS jobs' claim specs are kept; at most MAX_CLAIMS of a template's entries are read;
    a status count past MAX_PER_WORKER is ignored; an earlier job's pods are not this job's."""
    from disttrain.api.constants import MAX_CLAIMS
    from disttrain.builders.claims import MAX_PER_WORKER
    from disttrain.control.claims import MAX_JOBS

    reads = Reads({("ResourceClaimTemplate", "two-gpus"): TWO})
    claims = Claims(reads, FakeClock(), ["gpu.example.com"])
    for i in range(MAX_JOBS + 5):
        asyncio.run(claims.observe(mpi_with_claims(2, {"name": "g", "resourceClaimTemplateName": "two-gpus"},
                                                   uid=f"uid-{i}"), []))
    assert len(claims.specs) == MAX_JOBS and "uid-0" not in claims.specs, "the oldest let go"

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
