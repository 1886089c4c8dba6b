"""`make bench`: the operator against a plain client making the same API writes, on a fresh local
control plane with KWOK nodes, every scenario interleaved in one run (bench_plain.py says what the
baseline does). Writes bench/results.json, bench/results.md and two plots.

1. burst: J jobs of 5 pods (chief, ps, 3 workers) applied at once, R rounds (1,000 jobs on 12
   nodes, issue 45): T_operator / T_plain for "all pods exist", and per-job apply -> all its pods
   (p50, p99);
2. completion: the last burst round's jobs, Running, their chiefs finish together: chief
   Succeeded -> job phase Succeeded, and -> its other pods being deleted (p50, p99);
3. single job on an idle operator: apply -> all 5 pods (p50, p90);
4. scale: jobs held in steps up to 4,000 jobs / 20,000 pods: the operator's RSS and CPU seconds,
   a probe job's apply -> pods at each step, no pod missed or made twice;
5. API cost: the operator's requests per job during the burst, by verb and resource, from the API
   server's audit log (the operator has a user of its own), against the minimum;
6. progress storm: a pod reporting 1,000 times a second while jobs are applied (bench_progress.py);
7. large jobs: 1,024 workers, TensorFlow and MPI: apply -> pods, status writes, the checkpoint
   request's fan-out (bench_large.py).

Ratios, not seconds, are what to compare across machines: the two sides share the machine's
noise. `--quick` is the same at a size that runs in under 5 minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import functools
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "hack"))
sys.path.insert(0, str(REPO / "operator"))
import bench_large  # noqa: E402
import bench_progress  # noqa: E402
from bench_observe import (  # noqa: E402
    OPERATOR_USER,
    PLAIN_USER,
    AuditLog,
    Timeline,
    descendants,
    gather_limited,
    is_endpoint,
    operator_memory,
    process_usage,
    start_watches,
    until,
)
from bench_plain import PlainClient, plain_crd  # noqa: E402
from bench_report import write_results  # noqa: E402
from crdserved import served  # noqa: E402
from kwokpods import ended_otherwise  # noqa: E402
from localcluster import LocalCluster  # noqa: E402
from ports import free_port  # noqa: E402

RESULTS = REPO / "bench"
PODS_PER_JOB = 5
# What --only can pick; the burst brings its completion and after-burst measures with it.
SCENARIOS = frozenset({"single", "storm", "burst", "large", "scale"})


@dataclass(frozen=True)
class Size:
    burst_jobs: int
    burst_rounds: int
    single_runs: int
    scale_steps: tuple[int, ...]  # jobs held at each step
    nodes: int
    scale_nodes: int  # the nodes once the scale steps start
    large_workers: int  # bench_large.py's jobs


# Issue 45's load: bursts of 1,000 jobs (5,000 pods) on 12 KWOK nodes of 1,000 pods. The scale steps
# hold up to 4,000 jobs / 20,000 pods: 12 more nodes come before them, room for the probes too.
FULL = Size(burst_jobs=1000, burst_rounds=3, single_runs=20, scale_steps=(500, 1000, 1500, 2000, 3000, 4000),
            nodes=12, scale_nodes=24, large_workers=bench_large.LARGE_WORKERS)
QUICK = Size(burst_jobs=60, burst_rounds=1, single_runs=6, scale_steps=(100, 200), nodes=4, scale_nodes=4,
             large_workers=128)


def job_manifest(name: str) -> dict[str, Any]:
    """A ParameterServer-shaped job. No resource requests: KWOK nodes hold 1,000 pods each and the
    scheduler's fit for CPU is not what is measured."""
    def replica(n: int) -> dict[str, Any]:
        return {"replicas": n, "restartPolicy": "ExitCode",
                "template": {"spec": {"containers": [{"name": "tf", "image": "tf"}]}}}
    return {"apiVersion": "disttrain.dev/v1", "kind": "DistTrainJob", "metadata": {"name": name},
            "spec": {"tensorflow": {"chief": replica(1), "ps": replica(1), "worker": replica(3)}}}


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


@dataclass
class Bench:
    admin: Any  # ApiClient as the admin: the "user" applying jobs, and the bench's watches
    plain: PlainClient
    operator_pid: int
    audit: AuditLog
    timeline: Timeline = field(default_factory=Timeline)
    results: dict[str, Any] = field(default_factory=dict)
    plane_pids: dict[str, int] = field(default_factory=dict)  # the API server's and etcd's: their CPU a round

    def plane_cpu(self) -> float:
        return sum(process_usage(pid).cpu_seconds for pid in self.plane_pids.values())

    @property
    def core(self) -> Any:
        return client.CoreV1Api(self.admin)

    @property
    def custom(self) -> Any:
        return client.CustomObjectsApi(self.admin)

    async def namespace(self, prefix: str) -> str:
        ns = f"{prefix}-{uuid.uuid4().hex[:5]}"
        await self.core.create_namespace({"metadata": {"name": ns}})
        for _ in range(300):  # pods can't be created before the namespace's ServiceAccount exists
            if (await self.core.list_namespaced_service_account(ns)).items:
                break
            await asyncio.sleep(0.1)
        return ns

    async def drop(self, ns: str) -> None:
        await self.core.delete_namespace(ns)
        await until_gone(self.core, ns)

    async def apply(self, ns: str, name: str) -> None:
        await self.custom.create_namespaced_custom_object("disttrain.dev", "v1", ns, "disttrainjobs",
                                                          job_manifest(name))

    async def submit(self, side: str, ns: str, names: list[str], limit: int = 200) -> dict[str, float]:
        """Apply `names` at once (up to `limit` requests in flight); the time each was sent."""
        sent: dict[str, float] = {}

        def one(name: str) -> Any:
            async def go() -> None:
                sent[name] = time.monotonic()
                await (self.apply(ns, name) if side == "operator" else self.plain.submit(ns, name))
            return go
        await gather_limited(limit, [one(n) for n in names])
        return sent

    async def until_pods_of(self, job: tuple[str, str]) -> None:
        await until(lambda: self.timeline.job_pods_complete(job, PODS_PER_JOB) is not None, 120, f"pods of {job}")

    async def all_pods(self, ns: str, count: int, timeout: float = 900) -> float:
        return await until(lambda: self.timeline.pods_in(ns) >= count, timeout, f"{count} pods in {ns}")

    def per_job(self, ns: str, sent: dict[str, float]) -> list[float]:
        out = []
        for name, t in sent.items():
            done = self.timeline.job_pods_complete((ns, name), PODS_PER_JOB)
            assert done is not None, f"{ns}/{name} has not all its pods"
            out.append(done - t)
        return out

    # -- scenarios -------------------------------------------------------------------------------

    async def burst(self, jobs: int, rounds: int) -> tuple[str, str]:
        """Returns the last round's namespaces (operator, plain): their jobs are kept for completion."""
        totals: dict[str, list[float]] = {"operator": [], "plain": []}
        per_job: dict[str, list[float]] = {"operator": [], "plain": []}
        curves: dict[str, list[float]] = {}
        kept: dict[str, str] = {}
        for r in range(rounds):
            for side in ("operator", "plain"):  # interleaved: drift in the machine's load hits both
                ns = await self.namespace(f"burst-{side[:2]}")
                self.audit.mark()
                names = [f"job-{i}" for i in range(jobs)]
                marking = None if side == "operator" else asyncio.create_task(
                    self.plain.mark_running(ns, jobs, asyncio.Event()))  # the operator's Running writes, too
                cpu, plane = process_usage(self.operator_pid).cpu_seconds, self.plane_cpu()
                start = time.monotonic()
                sent = await self.submit(side, ns, names)
                end = await self.all_pods(ns, jobs * PODS_PER_JOB)
                cpu, plane = process_usage(self.operator_pid).cpu_seconds - cpu, self.plane_cpu() - plane
                self.results.setdefault("burst_plane_cpu_s", {}).setdefault(side, []).append(plane)
                if marking is not None:
                    await asyncio.wait_for(marking, 600)
                    await asyncio.sleep(2.5)  # the audit log is written in batches of up to 1 s
                    self.results.setdefault("api_cost_plain_rounds", []).append(self.audit.since_mark(PLAIN_USER))
                totals[side].append(end - start)
                per_job[side] += self.per_job(ns, sent)
                curves[side] = sorted(t - start for (n, _), t in self.timeline.pod_added.items() if n == ns)
                if side == "operator":
                    await self.until_phase(ns, names, "Running")
                    await asyncio.sleep(2.5)  # the audit log is written in batches of up to 1 s
                    self.results.setdefault("api_cost_rounds", []).append(self.audit.since_mark(OPERATOR_USER))
                    dups = self.timeline.duplicates(ns)
                    assert not dups, f"pods made twice: {dups[:5]}"
                if side == "operator":
                    self.results.setdefault("burst_operator_cpu_s", []).append(cpu)
                print(f"  burst round {r + 1}/{rounds} {side}: {end - start:.2f} s for {jobs * PODS_PER_JOB} pods"
                      f" (CPU s meanwhile: the operator's controller {cpu:.1f}, the API server and etcd {plane:.1f})",
                      flush=True)
                if r == rounds - 1:
                    kept[side] = ns
                else:
                    await self.drop(ns)
        op, plain = statistics.median(totals["operator"]), statistics.median(totals["plain"])
        self.results["burst"] = {
            "jobs": jobs, "pods": jobs * PODS_PER_JOB, "rounds": rounds,
            "operator_s": totals["operator"], "plain_s": totals["plain"], "ratio": op / plain,
            "per_job_operator": {"p50": pct(per_job["operator"], 0.5), "p99": pct(per_job["operator"], 0.99)},
            "per_job_plain": {"p50": pct(per_job["plain"], 0.5), "p99": pct(per_job["plain"], 0.99)},
            "curves": curves,
        }
        return kept["operator"], kept["plain"]

    async def completion(self, op_ns: str, plain_ns: str, jobs: int) -> None:
        from kwokpods import EXIT_CODE_ANNOTATION

        names = [f"job-{i}" for i in range(jobs)]
        out: dict[str, Any] = {"jobs": jobs}
        for side, ns in (("operator", op_ns), ("plain", plain_ns)):
            await self.until_running(ns, jobs * PODS_PER_JOB)
            stop = asyncio.Event()
            responder = (asyncio.create_task(self.plain.finish_when_chief_done(ns, jobs, stop))
                         if side == "plain" else None)
            await asyncio.sleep(1.0 if responder else 0)  # its watch is open
            await gather_limited(64, [self.finisher(ns, f"{n}-chief-0", EXIT_CODE_ANNOTATION) for n in names])
            done = "Succeeded"
            await self.until_phase(ns, names, done)
            others = [f"{t}-{i}" for t, count in (("ps", 1), ("worker", 3)) for i in range(count)]
            gone = [(ns, f"{n}-{o}") for n in names for o in others]
            await self.until_deleting(gone)
            if responder:
                stop.set()
                await responder
            to_phase, to_deleted = [], []
            for n in names:
                chief_done = self.timeline.pod_succeeded[(ns, f"{n}-chief-0")]
                to_phase.append(self.timeline.phase_seen[(ns, n)][done] - chief_done)
                to_deleted.append(max(self.timeline.pod_deleting[(ns, f"{n}-{o}")] for o in others) - chief_done)
            out[side] = {"to_succeeded": {"p50": pct(to_phase, 0.5), "p99": pct(to_phase, 0.99)},
                         "to_pods_deleted": {"p50": pct(to_deleted, 0.5), "p99": pct(to_deleted, 0.99)}}
            print(f"  completion {side}: p99 chief done -> Succeeded {out[side]['to_succeeded']['p99']:.3f} s",
                  flush=True)
        self.results["completion"] = out
        await asyncio.gather(self.drop(op_ns), self.drop(plain_ns))

    def finisher(self, ns: str, pod: str, annotation: str) -> Any:
        async def go() -> None:
            try:
                await self.core.patch_namespaced_pod(pod, ns, {"metadata": {"annotations": {annotation: "0"}}})
            except ApiException as err:  # a pod the operator already removed has ended: see kwokpods
                if not ended_otherwise(err.status, with_uid=False):
                    raise
        return go

    async def until_phase(self, ns: str, names: list[str], phase: str) -> None:
        keys = [(ns, n) for n in names]
        await until(lambda: all(phase in self.timeline.phase_seen.get(k, {}) for k in keys), 120,
                    f"jobs {phase} in {ns}")

    async def until_deleting(self, keys: list[tuple[str, str]]) -> None:
        await until(lambda: all(k in self.timeline.pod_deleting for k in keys), 300, "pods deleted")

    def pods_running(self, ns: str) -> int:
        return self.timeline.running.get(ns, 0)

    async def until_running(self, ns: str, count: int) -> None:
        await until(lambda: self.pods_running(ns) >= count, 600, f"{count} pods Running in {ns}")

    async def single(self, runs: int) -> None:
        lat: dict[str, list[float]] = {"operator": [], "plain": []}
        spaces = {side: await self.namespace(f"single-{side[:2]}") for side in lat}
        for i in range(runs):
            for side, ns in spaces.items():
                await asyncio.sleep(0.5)  # idle: nothing else in flight
                sent = await self.submit(side, ns, [f"one-{i}"])
                await self.all_pods(ns, (i + 1) * PODS_PER_JOB, 60)
                lat[side] += self.per_job(ns, sent)
        self.results["single"] = {side: {"p50": pct(v, 0.5), "p90": pct(v, 0.9), "runs": runs}
                                  for side, v in lat.items()}
        print(f"  single job: operator p50 {self.results['single']['operator']['p50'] * 1000:.0f} ms, "
              f"plain p50 {self.results['single']['plain']['p50'] * 1000:.0f} ms", flush=True)
        await asyncio.gather(*(self.drop(ns) for ns in spaces.values()))

    async def progress_storm(self, runs: int, kubectl: str, env: dict[str, str]) -> None:
        """A reporting pod's storm of progress reports (bench_progress.py) against jobs applied meanwhile."""
        ns, probes = await self.namespace("storm"), await self.namespace("probe-storm")
        await self.apply(ns, "reporter")
        await self.until_pods_of((ns, "reporter"))
        url, ca, token = bench_progress.pod_credentials(kubectl, env, ns, bench_progress.pod_json(
            kubectl, env, ns, "reporter-chief-0"))

        async def probe(count: int, tag: str) -> list[float]:
            out = []
            for i in range(count):
                await asyncio.sleep(0.5)
                sent = await self.submit("operator", probes, [f"{tag}-{i}"])
                await self.until_pods_of((probes, f"{tag}-{i}"))
                out += self.per_job(probes, sent)
            return out
        quiet = await probe(runs, "before")
        writes_before = self.timeline.job_events[(ns, "reporter")]
        cpu_before = process_usage(self.operator_pid).cpu_seconds
        with tempfile.TemporaryDirectory() as workdir:
            flood = await bench_progress.storm_process(url, ca, token, bench_progress.STORM_SECONDS, workdir)
            await asyncio.sleep(1)
            stormy: list[float] = []
            sender_cpu = 0.0
            while flood.returncode is None or not stormy:  # probes for as long as the storm lasts
                stormy += await probe(1, f"storm-{len(stormy)}")
                with contextlib.suppress(OSError, IndexError):  # the sender's CPU, while it is there
                    sender_cpu = process_usage(flood.pid).cpu_seconds
            codes = await bench_progress.storm_answers(flood)
        cpu = process_usage(self.operator_pid).cpu_seconds - cpu_before
        writes = self.timeline.job_events[(ns, "reporter")] - writes_before
        quiet += await probe(runs, "after")
        self.results["progress_storm"] = bench_progress.summary(quiet, stormy, codes, writes, cpu, sender_cpu)
        print(f"  progress storm: {self.results['progress_storm']}", flush=True)
        await asyncio.gather(self.drop(ns), self.drop(probes))
        quiet_cpu = process_usage(self.operator_pid).cpu_seconds
        await asyncio.sleep(10)
        print(f"  after the storm: the controller used {process_usage(self.operator_pid).cpu_seconds - quiet_cpu:.2f} "
              f"CPU s in 10 quiet seconds", flush=True)

    async def after_burst(self, quiet: float = 45.0) -> None:
        """The operator's RSS when the burst's jobs are gone, and once it has been quiet a while
        (runtime/memory.py gives the burst's freed heap back after 20 s without work)."""
        high = process_usage(self.operator_pid).rss_bytes / 2**20
        await asyncio.sleep(quiet)
        low = process_usage(self.operator_pid).rss_bytes / 2**20
        self.results["after_burst"] = {"high_mb": high, "quiet_mb": low, "quiet_s": quiet}
        print(f"  after the burst: RSS {high:.0f} MB, {quiet:.0f} s later {low:.0f} MB", flush=True)

    async def scale(self, steps: tuple[int, ...]) -> None:
        ns = await self.namespace("scale")
        probes = {side: await self.namespace(f"probe-{side[:2]}") for side in ("operator", "plain")}
        held, points = 0, []
        idle = process_usage(self.operator_pid)
        for step in steps:
            before = process_usage(self.operator_pid)
            await self.submit("operator", ns, [f"s-{i}" for i in range(held, step)], limit=64)
            await self.all_pods(ns, step * PODS_PER_JOB, 1200)
            await self.until_running(ns, step * PODS_PER_JOB)
            await asyncio.sleep(3)
            after, pss = process_usage(self.operator_pid), operator_memory(self.operator_pid)
            probe: dict[str, list[float]] = {"operator": [], "plain": []}
            for p in range(3):
                for side, pns in probes.items():
                    name = f"p{step}-{p}"
                    sent = await self.submit(side, pns, [name])
                    await self.until_pods_of((pns, name))
                    probe[side] += self.per_job(pns, sent)
            dups = self.timeline.duplicates(ns)
            assert not dups, f"pods made twice: {dups[:5]}"
            assert self.timeline.pods_in(ns) == step * PODS_PER_JOB
            point = {"jobs": step, "pods": step * PODS_PER_JOB, "rss_mb": after.rss_bytes / 2**20,
                     "pss": pss,
                     "cpu_s": after.cpu_seconds - idle.cpu_seconds,
                     "cpu_s_per_1000_pods": (after.cpu_seconds - before.cpu_seconds) * 1000
                                            / ((step - held) * PODS_PER_JOB),
                     "probe_operator_s": statistics.median(probe["operator"]),
                     "probe_plain_s": statistics.median(probe["plain"])}
            points.append(point)
            held = step
            print(f"  scale {point['pods']} pods: RSS {point['rss_mb']:.0f} MB, PSS {pss_line(pss)}, "
                  f"{point['cpu_s_per_1000_pods']:.1f} CPU s/1000 pods, probe {point['probe_operator_s']:.3f} s "
                  f"(plain {point['probe_plain_s']:.3f} s)", flush=True)
        self.results["scale"] = {"points": points, "missed_or_duplicated_pods": 0}


def pss_line(pss: dict[str, float]) -> str:
    return (f"{pss['controller_mb']:.0f} + {pss['endpoint_mb']:.0f} (endpoint) + {pss['other_mb']:.0f} "
            f"(other children) = {pss['sum_mb']:.0f} MB")


async def until_gone(core: Any, ns: str) -> None:
    from kubernetes_asyncio.client.exceptions import ApiException

    for _ in range(1200):
        try:
            await core.read_namespace(ns)
        except ApiException as err:
            if err.status == 404:
                return
            raise
        await asyncio.sleep(0.25)


async def api_client(kubeconfig: Path) -> Any:
    cfg = client.Configuration()
    await config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
    cfg.connection_pool_maxsize = 64
    return client.ApiClient(cfg)


async def settled(operator_pid: int, endpoint: bool = True, seconds: float = 60.0, quiet: float = 10.0) -> None:
    """Idle means started: its progress endpoint running (a process under it), then `quiet` seconds more.
    Measured 3 s after its start, the endpoint had not always started (issue 45)."""
    began = time.monotonic()
    while endpoint and not any(is_endpoint(pid) for pid in descendants(operator_pid)) \
            and time.monotonic() - began < seconds:
        await asyncio.sleep(0.5)
    await asyncio.sleep(quiet)


def idle_without_endpoint(env: dict[str, str], log: Any) -> dict[str, float]:
    """The controller alone, idle, its progress endpoint off (`disttrain run` without --progress-port):
    started before the measured operator, and stopped before it starts (issue 45's goal: <= 46 MB)."""
    operator = subprocess.Popen([sys.executable, "-m", "disttrain", "run"], env=env, stdout=log,
                                stderr=subprocess.STDOUT, cwd=REPO / "operator")
    try:
        asyncio.run(settled(operator.pid, endpoint=False, quiet=15.0))
        memory = operator_memory(operator.pid)
    finally:
        operator.terminate()
        operator.wait(timeout=30)
    print(f"operator idle, its endpoint off: PSS {memory['sum_mb']:.0f} MB", flush=True)
    return memory


async def run(cluster: LocalCluster, operator_pid: int, size: Size, only: frozenset[str] = SCENARIOS
              ) -> dict[str, Any]:
    admin = await api_client(cluster.kubeconfig)
    plain_api = await api_client(cluster.user_kubeconfig(PLAIN_USER, ["system:masters"]))
    bench = Bench(admin, PlainClient(plain_api, job_manifest("x")), operator_pid,
                  AuditLog(cluster.root / "audit.log"),
                  plane_pids={n: cluster.processes[n] for n in ("kube-apiserver", "etcd") if n in cluster.processes})
    stop = asyncio.Event()
    watches = start_watches(admin, bench.timeline, stop)
    try:
        await settled(operator_pid)
        idle = process_usage(operator_pid)
        bench.results["idle"] = {"rss_mb": idle.rss_bytes / 2**20, "pss": operator_memory(operator_pid)}
        print(f"operator idle: RSS {idle.rss_bytes / 2**20:.0f} MB; PSS {pss_line(bench.results['idle']['pss'])}",
              flush=True)
        if "single" in only:
            print(f"single job, {size.single_runs} runs each side", flush=True)
            await bench.single(size.single_runs)
        if "storm" in only:
            print(f"progress storm: {bench_progress.REPORTS_PER_SECOND} reports/s, {size.single_runs} probes each way",
                  flush=True)
            await bench.progress_storm(size.single_runs, str(REPO / ".cache" / "bin" / "kubectl"),
                                       {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)})
        if "burst" in only:
            print(f"burst: {size.burst_jobs} jobs x {PODS_PER_JOB} pods, {size.burst_rounds} rounds", flush=True)
            op_ns, plain_ns = await bench.burst(size.burst_jobs, size.burst_rounds)
            print("completion", flush=True)
            await bench.completion(op_ns, plain_ns, size.burst_jobs)
            await bench.after_burst()
        if "large" in only:
            print(f"large jobs: {size.large_workers} workers, TensorFlow and MPI", flush=True)
            bench.results["large"] = await bench_large.large(bench, size.large_workers)
        if "scale" in only:
            for i in range(size.nodes, size.scale_nodes):
                cluster.create_node(i)
            print(f"scale: {' -> '.join(str(s * PODS_PER_JOB) for s in size.scale_steps)} pods held", flush=True)
            await bench.scale(size.scale_steps)
    finally:
        stop.set()
        for task in watches:
            task.cancel()
        await asyncio.gather(*watches, return_exceptions=True)
        await admin.close()
        await plain_api.close()
    return bench.results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the same scenarios, small: under 5 minutes")
    parser.add_argument("--profile", action="store_true",
                        help="record the operator with py-spy (pip install py-spy) into bench/profile.raw")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--only", default=",".join(sorted(SCENARIOS)),
                        help=f"a comma-separated subset of {', '.join(sorted(SCENARIOS))} (to look into one; "
                             "bench/results.* come from a whole run)")
    parser.add_argument("--scale-steps", help="jobs held at each scale step, comma-separated (5 pods each)")
    parser.add_argument("--burst", help="JOBS,ROUNDS of the burst (to look into it at another size)")
    parser.add_argument("--operator-arg", action="append", default=[],
                        help="one more argument for `disttrain run` (e.g. --operator-arg=--resync-seconds=30)")
    args = parser.parse_args()
    only = frozenset(args.only.split(","))
    if not only <= SCENARIOS:
        parser.error(f"--only: unknown {', '.join(sorted(only - SCENARIOS))}")
    size = QUICK if args.quick else FULL
    if args.scale_steps:
        size = dataclasses.replace(size, scale_steps=tuple(int(n) for n in args.scale_steps.split(",")))
    if args.burst:
        jobs, rounds = (int(n) for n in args.burst.split(","))
        size = dataclasses.replace(size, burst_jobs=jobs, burst_rounds=rounds)
    started = time.monotonic()
    root = REPO / ".cache" / "bench-cluster"
    with LocalCluster(root=root, nodes=size.nodes, gang_schedulers=False, kueue=False,
                      audit_users=(OPERATOR_USER, PLAIN_USER)) as cluster:
        kubectl = str(REPO / ".cache" / "bin" / "kubectl")
        env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
        crd = str(REPO / "crds" / "disttrainjobs.disttrain.dev.yaml")
        plain = root / "plaintrainjobs.json"  # the plain client's jobs: the same CRD under its own group
        plain_doc = plain_crd()
        plain.write_text(json.dumps(plain_doc))
        for path, crd_doc in ((crd, yaml.safe_load(Path(crd).read_text())), (str(plain), plain_doc)):
            subprocess.run([kubectl, "apply", "--server-side", "-f", path], env=env, check=True, capture_output=True)
            cluster.wait(f"{crd_doc['metadata']['name']} served",
                         functools.partial(served, functools.partial(cluster.api, "GET"), crd_doc),
                         time.monotonic() + 120)
        op_env = {**env, "KUBECONFIG": str(cluster.user_kubeconfig(OPERATOR_USER, ["system:masters"]))}
        log = open(root / "operator.log", "wb")  # noqa: SIM115 - the child writes to it
        endpoint_off = idle_without_endpoint(op_env, log)
        # Progress reports served as the chart does (issue 23): its pods carry the endpoint's address and CA.
        progress = ["--progress-port", str(free_port()), "--progress-tls-secret", "default/disttrain-progress-tls",
                    "--progress-status-seconds", str(bench_progress.STATUS_SECONDS)]
        operator = subprocess.Popen([sys.executable, "-m", "disttrain", "run", *progress, *args.operator_arg],
                                    env=op_env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO / "operator")
        profiler = None
        if args.profile:
            args.out.mkdir(exist_ok=True)
            profiler = subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record", "--pid",
                                         str(operator.pid), "--format", "raw", "--rate", "50", "--nonblocking",
                                         "-o", str(args.out / "profile.raw")], stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
        try:
            results = asyncio.run(run(cluster, operator.pid, size, only))
            results["idle"]["pss_endpoint_off"] = endpoint_off
        finally:
            if profiler is not None:
                profiler.send_signal(signal.SIGINT)  # py-spy writes its file on an interrupt
                profiler.wait(timeout=60)
            operator.terminate()
            operator.wait(timeout=10)
    results["machine"] = {"cpus": os.cpu_count(), "size": "quick" if args.quick else "full",
                          "minutes": (time.monotonic() - started) / 60}
    if only != SCENARIOS:  # a part: its numbers only, never over a whole run's results.md
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "partial.json").write_text(json.dumps(results, indent=2) + "\n")
        print(json.dumps(results, indent=2))
        return 0
    write_results(args.out, results)
    print((args.out / "results.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
