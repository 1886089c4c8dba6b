"""The lines `disttrain progress` adds for a job's usage (status.usage) and a stall: pure
functions of the job's status and the clock.

      Stalled (12m ago): the training has reported step 1500 since ...; runPolicy.onStall is Report: ...
      GPU-hours 2.14, goodput 81% (counted 12s ago): training 81%  redone 9%  waiting 6%  stalled 4%
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

from disttrain.api.crd_usage import USES
from disttrain.client.curves import ago


def usage_lines(status: Mapping[str, Any], now: datetime.datetime) -> list[str]:
    lines = []
    stalled = next((c for c in status.get("conditions") or []
                    if c.get("type") == "Stalled" and c.get("status") == "True"), None)
    if stalled is not None:
        lines.append(f"  Stalled ({ago(stalled.get('lastTransitionTime'), now)}): {stalled.get('message', '')}")
    found = status.get("usage")
    if not isinstance(found, Mapping) or not isinstance(found.get("seconds"), Mapping):
        return lines
    total = _number(found.get("allocatedSeconds"))
    what = "GPU-hours" if found.get("resource") == "nvidia.com/gpu" else "CPU core-hours"
    head = f"  {what} {total / 3600:.2f}"
    if total > 0:
        head += f", goodput {_number(found.get('goodputPercent')):.0f}%"
    head += f" (counted {ago(found.get('countedAt'), now)})"
    seconds = found["seconds"]
    shares = [(use, _number(seconds.get(use))) for use in USES]
    shares.append(("unsettled", _number(found.get("unsettledSeconds"))))  # since the last new step
    split = [f"{use} {100 * value / total:.0f}%" for use, value in shares if total > 0 and value > 0]
    lines.append(head + (": " + "  ".join(split) if split else ""))
    return lines


def _number(value: Any) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0
