"""`make bench`'s progress storm (issue 23): one job's reporting pod sends REPORTS_PER_SECOND
reports a second (paced, with a token the API server binds to the pod) for STORM_SECONDS;
meanwhile a job is applied again and again on the idle side of the plane, and its apply -> all
pods latency is compared with the same runs without the storm, before and after. Also counted: the
reports the endpoint accepted and throttled, and the reporting job's status writes during the storm
against its bound (one per --progress-status-seconds).

The storm is sent by a process of its own at the lowest CPU priority (`python bench_progress.py
URL CA_FILE TOKEN_FILE SECONDS`): a real storm comes from a pod on another machine, and on this
2-CPU plane a sender in the bench's own event loop would slow the bench's clock of the probes
(first runs: 1.26x with it there, most of it the bench's own)."""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import statistics
import subprocess
import sys
import time
from typing import Any

import aiohttp

REPORTS_PER_SECOND = 1000
STATUS_SECONDS = 15.0  # the operator's --progress-status-seconds in the bench (the chart's default)
STORM_SECONDS = 2 * STATUS_SECONDS + 2  # long enough for the bound to show: at most 3 writes


def pod_credentials(kubectl: str, env: dict[str, str], ns: str, pod: dict[str, Any]) -> tuple[str, str, str]:
    """What the kubelet would give the reporting pod: its report URL, the endpoint's CA, a bound token."""
    annotations = pod["metadata"]["annotations"]
    token = subprocess.run([kubectl, "create", "token", "default", "-n", ns, "--audience", "disttrain.dev/progress",
                            "--bound-object-kind", "Pod", "--bound-object-name", pod["metadata"]["name"],
                            "--bound-object-uid", pod["metadata"]["uid"]], env=env, check=True, capture_output=True,
                           text=True).stdout.strip()
    return annotations["disttrain.dev/progress-url"], annotations["disttrain.dev/progress-ca"], token


async def storm(url: str, ca: str, token: str, seconds: float) -> dict[str, float]:
    """Reports paced at REPORTS_PER_SECOND (16 connections) for `seconds`: answers by code."""
    codes: dict[int, int] = {}
    context = ssl.create_default_context(cadata=ca)
    started = time.monotonic()
    sent = due = 0

    async def one(session: aiohttp.ClientSession, step: int) -> None:
        async with session.post(url, json={"step": step, "totalSteps": 10**9, "metrics": {"loss": 1 / step}},
                                headers={"Authorization": f"Bearer {token}"}) as resp:
            await resp.read()
            codes[resp.status] = codes.get(resp.status, 0) + 1

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context, limit=16)) as session:
        pending: set[asyncio.Task[None]] = set()
        while time.monotonic() - started < seconds:
            due = int((time.monotonic() - started) * REPORTS_PER_SECOND)
            while sent < due and len(pending) < 256:
                sent += 1
                task = asyncio.create_task(one(session, sent))
                pending.add(task)
                task.add_done_callback(pending.discard)
            await asyncio.sleep(0.005)
        await asyncio.gather(*pending, return_exceptions=True)
    # offered: what the pacing asked for; sent: what went out (at most 256 wait for an answer, so a
    # server that holds its answers back paces the sender, as it would any client that waits for them)
    return {str(k): float(v) for k, v in codes.items()} | {"seconds": round(time.monotonic() - started, 1),
                                                           "offered": float(due), "sent": float(sent)}


async def storm_process(url: str, ca: str, token: str, seconds: float, workdir: str) -> asyncio.subprocess.Process:
    """The storm in a process of its own at nice 19; its answers come out as JSON on stdout."""
    files = []
    for name, text in (("ca.crt", ca), ("token", token)):
        path = os.path.join(workdir, name)
        with open(path, "w") as out:
            out.write(text)
        files.append(path)
    return await asyncio.create_subprocess_exec("nice", "-n", "19", sys.executable, __file__, url, *files,
                                                str(seconds), stdout=asyncio.subprocess.PIPE)


async def storm_answers(process: asyncio.subprocess.Process) -> dict[str, float]:
    out, _ = await process.communicate()
    answers: dict[str, float] = json.loads(out)
    return answers


def pod_json(kubectl: str, env: dict[str, str], ns: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(subprocess.run([kubectl, "get", "pod", name, "-n", ns, "-o", "json"], env=env,
                                                      check=True, capture_output=True, text=True).stdout)
    return found


def summary(quiet: list[float], stormy: list[float], codes: dict[str, float], writes: int,
            operator_cpu_seconds: float, sender_cpu_seconds: float = 0.0) -> dict[str, Any]:
    seconds = float(codes.get("seconds", 1))
    answered = sum(v for k, v in codes.items() if k.isdigit())
    return {"operator_cpu_share": round(operator_cpu_seconds / seconds, 3),
            "sender_cpu_share": round(sender_cpu_seconds / seconds, 3),
            "reports_per_second": round(answered / seconds),
            "offered_per_second": round(codes.get("offered", answered) / seconds),
            "answers": codes, "status_writes": writes, "status_write_bound": int(seconds / STATUS_SECONDS) + 1,
            "apply_to_pods_quiet": {"p50": statistics.median(quiet), "runs": len(quiet)},
            "apply_to_pods_storm": {"p50": statistics.median(stormy), "runs": len(stormy)},
            "ratio": statistics.median(stormy) / statistics.median(quiet)}



if __name__ == "__main__":
    url_arg, ca_file, token_file, seconds_arg = sys.argv[1:5]
    with open(ca_file) as ca_in, open(token_file) as token_in:
        ca_text, token_text = ca_in.read(), token_in.read()
    print(json.dumps(asyncio.run(storm(url_arg, ca_text, token_text, float(seconds_arg)))))
