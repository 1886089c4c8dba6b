"""What a pod template asks for: GPUs and CPUs, read one way everywhere."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any

from disttrain.api.constants import GPU_RESOURCE

# A quantity as apimachinery reads one (pkg/api/resource/quantity.go): a decimal number, then a
# binary or decimal SI suffix or a decimal exponent. Ours, not the Kubernetes library's
# parse_quantity: importing that imports the whole library (kubernetes/__init__ loads its client,
# 43 MB in the operator's process, measured). Tested against it (tests/unit/test_quantity.py).
_QUANTITY = re.compile(r"([+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+))(?:([eE][+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?)")
_SCALE = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "k": Decimal(10**3),
          "M": Decimal(10**6), "G": Decimal(10**9), "T": Decimal(10**12), "P": Decimal(10**15), "E": Decimal(10**18),
          **{f"{p}i": Decimal(2 ** (10 * (i + 1))) for i, p in enumerate("KMGTPE")}}


def quantity(value: Any) -> Decimal | None:
    """A resource quantity, or None if it isn't one. The CRD's int-or-string schema lets "a lot"
    through; the pod API refuses it, and the job fails with its words (InvalidPodTemplate)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float | Decimal):
        return Decimal(value)
    found = _QUANTITY.fullmatch(str(value)) if isinstance(value, str) else None
    if found is None:
        return None
    number, exponent, suffix = found.groups()
    if exponent:
        return Decimal(number + exponent)
    return Decimal(number) * _SCALE[suffix] if suffix else Decimal(number)


def containers(template: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return list((template.get("spec") or {}).get("containers") or [])


def container_gpus(container: Mapping[str, Any]) -> int:
    """The container's nvidia.com/gpu: its limit, else its request (extended resources must have
    equal ones when both are set), else 0."""
    resources = container.get("resources") or {}
    for amounts in (resources.get("limits") or {}, resources.get("requests") or {}):
        if GPU_RESOURCE in amounts:
            return int(quantity(amounts[GPU_RESOURCE]) or 0)
    return 0


def template_gpus(template: Mapping[str, Any]) -> int:
    """GPUs a pod made from `template` asks for: the sum over its containers."""
    return sum(container_gpus(c) for c in containers(template))


def cpu_limit_cores(container: Mapping[str, Any]) -> int | None:
    """The container's CPU limit rounded down, at least 1; None when it has no limit."""
    cores = quantity(((container.get("resources") or {}).get("limits") or {}).get("cpu"))
    return None if cores is None else max(1, math.floor(cores))


def pod_requests(template: Mapping[str, Any]) -> dict[str, Decimal]:
    """What a pod from `template` asks the scheduler for, per resource, as the scheduler counts
    it: the sum of its containers' requests (a limit stands for a missing request), or the
    largest init container's request if that is more."""
    total = _sum(_requests(c) for c in containers(template))
    for init in (template.get("spec") or {}).get("initContainers") or []:
        for name, amount in _requests(init).items():
            total[name] = max(total.get(name, Decimal(0)), amount)
    return total


def _requests(container: Mapping[str, Any]) -> dict[str, Decimal]:
    resources = container.get("resources") or {}
    merged = dict(resources.get("limits") or {}) | dict(resources.get("requests") or {})
    return {name: amount for name, value in merged.items() if (amount := quantity(value)) is not None}


def _sum(amounts: Iterable[Mapping[str, Decimal]]) -> dict[str, Decimal]:
    total: dict[str, Decimal] = {}
    for each in amounts:
        for name, amount in each.items():
            total[name] = total.get(name, Decimal(0)) + amount
    return total
