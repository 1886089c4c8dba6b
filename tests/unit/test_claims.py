"""GPUs through DRA claims (builders/claims.py): which device classes are GPUs, and how many a
pod's claims allocate, counted as the scheduler and Kueue v0.19.2 count them."""

from __future__ import annotations

from typing import Any

import pytest

from disttrain.builders.claims import (
    UncountableClaim,
    count_claim,
    driver_of,
    gpu_device_classes,
    pod_claims,
    shared_gpu_claims,
    template_claim_gpus,
)

NVIDIA = {"metadata": {"name": "gpu.nvidia.com"}, "spec": {"selectors": [{"cel": {
    "expression": "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"}}]}}
MIG = {"metadata": {"name": "mig.nvidia.com"}, "spec": {"selectors": [{"cel": {
    "expression": 'device.driver == "gpu.nvidia.com" && device.attributes["gpu.nvidia.com"].type == "mig"'}}]}}
EXAMPLE = {"metadata": {"name": "gpu.example.com"}, "spec": {"selectors": [{"cel": {
    "expression": "device.driver == 'gpu.example.com'"}}]}}
NIC = {"metadata": {"name": "rdma.example.com"}, "spec": {"selectors": [{"cel": {
    "expression": "device.driver == 'rdma.example.com'"}}]}}
GPUS = gpu_device_classes([NVIDIA, EXAMPLE, NIC], ["gpu.example.com"])  # the example driver's, named


def exactly(cls: str, count: int | None = None, mode: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"deviceClassName": cls}
    if count is not None:
        body["count"] = count
    if mode is not None:
        body["allocationMode"] = mode
    return body


def spec(*requests: dict[str, Any]) -> dict[str, Any]:
    return {"devices": {"requests": [{"name": f"r{i}", **r} for i, r in enumerate(requests)]}}


def test_nvidias_classes_are_gpus_by_their_driver_and_others_only_when_named() -> None:
    assert driver_of(NVIDIA) == driver_of(MIG) == "gpu.nvidia.com" and driver_of({"spec": {}}) is None
    assert gpu_device_classes([NVIDIA, MIG, EXAMPLE, NIC]) == {"gpu.nvidia.com", "mig.nvidia.com"}
    assert gpu_device_classes([NVIDIA, EXAMPLE], ["gpu.example.com"]) == {"gpu.nvidia.com", "gpu.example.com"}


def test_a_claim_counts_its_gpu_requests_exact_counts_defaulting_to_one() -> None:
    gpus = frozenset({"gpu.nvidia.com"})
    assert count_claim(spec({"exactly": exactly("gpu.nvidia.com", 2)}), gpus).gpus() == 2
    assert count_claim(spec({"exactly": exactly("gpu.nvidia.com")}, {"exactly": exactly("rdma.example.com", 4)},
                           {"exactly": exactly("gpu.nvidia.com", 3, "ExactCount")}), gpus).gpus() == 4
    assert count_claim({}, gpus).gpus() == 0


def test_alternatives_count_when_they_agree_and_all_of_a_node_never_does() -> None:
    gpus = frozenset({"gpu.nvidia.com", "gpu.example.com"})
    same = {"firstAvailable": [{"name": "a", **exactly("gpu.nvidia.com", 2)},
                               {"name": "b", **exactly("gpu.example.com", 2)}]}
    assert count_claim(spec(same), gpus).gpus() == 2
    differ = {"firstAvailable": [{"name": "a", **exactly("gpu.nvidia.com", 4)},
                                 {"name": "b", **exactly("gpu.nvidia.com", 2)}]}
    with pytest.raises(UncountableClaim, match=r"requests\[0\] \(r0\): firstAvailable alternatives of \[2, 4\]"):
        count_claim(spec(differ), gpus).gpus()
    with pytest.raises(UncountableClaim, match=r"allocationMode All of device class gpu\.nvidia\.com"):
        count_claim(spec({"exactly": exactly("gpu.nvidia.com", mode="All")}), gpus).gpus()
    not_a_gpu = spec({"exactly": exactly("rdma.example.com", mode="All")})
    assert count_claim(not_a_gpu, gpus).gpus() == 0, "not a GPU: not counted"


def test_a_pods_gpus_are_its_claims_templates_and_shared_claims_named_as_such() -> None:
    template: dict[str, Any] = {"spec": {"resourceClaims": [
        {"name": "gpus", "resourceClaimTemplateName": "two-gpus"},
        {"name": "nic", "resourceClaimTemplateName": "one-nic"},
        {"name": "shared", "resourceClaimName": "team-gpu"},
        {"name": "unknown", "resourceClaimTemplateName": "not-read"},
        {"resourceClaimTemplateName": "nameless"}]}}
    assert [c.name for c in pod_claims(template)] == ["gpus", "nic", "shared", "unknown"]
    specs = {"template/two-gpus": spec({"exactly": exactly("gpu.example.com", 2)}),
             "template/one-nic": spec({"exactly": exactly("rdma.example.com")}),
             "claim/team-gpu": spec({"exactly": exactly("gpu.nvidia.com")})}
    counts = {key: count_claim(value, GPUS) for key, value in specs.items()}
    assert template_claim_gpus(template, counts) == 0, "the rank container names none of them"
    template["spec"]["containers"] = [{"name": "rank", "resources": {"claims": [
        {"name": n} for n in ("gpus", "nic", "shared", "unknown")]}}]
    assert template_claim_gpus(template, counts) == 3
    assert shared_gpu_claims(template, counts) == ["team-gpu"]
    assert template_claim_gpus({"spec": {}}, counts) == 0


def test_counts_a_claim_cant_be_allocated_or_that_are_no_number_are_refused_and_admin_access_counts_none() -> None:
    gpus = frozenset({"gpu.nvidia.com"})
    for count in (0, -3, 33, True, "2", 2.5, None):
        request = {"exactly": {"deviceClassName": "gpu.nvidia.com", "count": count}}
        with pytest.raises(UncountableClaim, match="is not a number of GPUs from 1 to 32"):
            count_claim(spec(request), gpus).gpus()
    many = [{"name": f"r{i}", "exactly": exactly("gpu.nvidia.com", 30)} for i in range(2)]
    with pytest.raises(UncountableClaim, match="more than 32 GPUs"):
        count_claim({"devices": {"requests": many}}, gpus).gpus()
    watch = {"exactly": {"deviceClassName": "gpu.nvidia.com", "count": 8, "adminAccess": True}}
    assert count_claim(spec(watch), gpus).gpus() == 0
    for malformed in ({"devices": {"requests": "x"}}, {"devices": [1]}, {"devices": {"requests": [
            {"exactly": {"deviceClassName": ["gpu.nvidia.com"]}}, 7, {"firstAvailable": "x"}]}}):
        assert count_claim(malformed, gpus).gpus() == 0


def test_a_class_pinning_the_driver_either_way_round_is_a_gpu_class() -> None:
    flipped = {"metadata": {"name": "flipped"},
               "spec": {"selectors": [{"cel": {"expression": "'gpu.nvidia.com' == device.driver"}}]}}
    assert driver_of(flipped) == "gpu.nvidia.com"
    assert driver_of({"spec": {"selectors": "junk"}}) is None
