"""A DRA driver's objects for KWOK's fake nodes, as a GPU driver publishes them: a DeviceClass whose
selector pins the driver, and a ResourceSlice per node listing its devices with model and memory
attributes (resource.k8s.io/v1). Nothing runs on a KWOK node, so no kubelet plugin prepares the
devices: the scheduler allocates them from the slices and KWOK starts the pods.

The class is not NVIDIA's, so the operator counts it as GPUs only when told (the session's
operator: `--gpu-device-class=gpu.example.com`; the chart: `dra.gpuDeviceClasses`), and Kueue
counts its devices as FAKE_GPU_RESOURCE (hack/kueue.py, resources.deviceClassMappings).
"""

from __future__ import annotations

from typing import Any

FAKE_GPU_DRIVER = "gpu.example.com"  # the driver dra-example-driver registers too
FAKE_GPU_CLASS = "gpu.example.com"
FAKE_GPU_RESOURCE = "example.com/gpu"
FAKE_GPU_MODEL = "LATEST-GPU-MODEL"
DEVICES_PER_NODE = 8


def device_class() -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": FAKE_GPU_CLASS},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{FAKE_GPU_DRIVER}"'}}]}}


def resource_slice(node: str, devices: int = DEVICES_PER_NODE) -> dict[str, Any]:
    """The node's devices, one pool of one slice, named gpu-0.. with a uuid, model and memory."""
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{FAKE_GPU_DRIVER}"},
        "spec": {"driver": FAKE_GPU_DRIVER, "nodeName": node,
                 "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                 "devices": [{"name": f"gpu-{i}",
                              "attributes": {"model": {"string": FAKE_GPU_MODEL},
                                             "uuid": {"string": f"gpu-{node}-{i}"},
                                             "index": {"int": i}},
                              "capacity": {"memory": {"value": "80Gi"}}} for i in range(devices)]},
    }


def claim_template(name: str, count: int, selector: str | None = None) -> dict[str, Any]:
    """A ResourceClaimTemplate asking `count` devices of the fake GPU class (`selector`: a CEL filter,
    such as `device.attributes["gpu.example.com"].model == "..."`)."""
    exactly: dict[str, Any] = {"deviceClassName": FAKE_GPU_CLASS, "count": count}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": name},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpus", "exactly": exactly}]}}}}
