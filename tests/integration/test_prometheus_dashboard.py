"""The chart's Grafana dashboard, proven against a real Prometheus (built from its Go module,
hack/versions.env): Prometheus scrapes the operator while a job runs, and every panel's PromQL
and both template variables return data for that job."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from manifests import mwms_job
from ports import free_port
from progress_support import operator_args, post_report, progress_volume
from support import Cluster, OperatorProcess, built_by, rendered_dashboard, wait_for, wait_pods_running

SCRAPE_SECONDS = 1
# Grafana's $__rate_interval is at least four scrape intervals; a fixed window that holds several
# samples stands in for it.
RATE_INTERVAL = "30s"


def get_json(url: str) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return json.loads(resp.read().decode())
    except OSError:  # not listening yet, or a query refused (HTTP 400 is an OSError too)
        return None


class Prometheus:
    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"

    def query(self, expr: str) -> list[dict[str, Any]]:
        answer = get_json(f"{self.base}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
        assert answer is not None and answer["status"] == "success", (expr, answer)
        result: list[dict[str, Any]] = answer["data"]["result"]
        return result

    def label_values(self, label: str, match: str) -> list[str]:
        """What Grafana's `label_values(<match>, <label>)` asks Prometheus."""
        answer = get_json(f"{self.base}/api/v1/label/{label}/values?" + urllib.parse.urlencode({"match[]": match}))
        assert answer is not None and answer["status"] == "success", (label, match, answer)
        values: list[str] = answer["data"]
        return values


@pytest.fixture
def served(cluster: Cluster, tmp_path: Path, operator: OperatorProcess) -> Iterator[int]:
    """An operator serving /metrics on a port of its own (the session's operator steps aside)."""
    port = free_port()
    operator.stop()
    proc = OperatorProcess(cluster, tmp_path / "served.log", ("--metrics-port", str(port), *operator_args(free_port())))
    proc.start()
    try:
        yield port
    finally:
        proc.stop()
        operator.start()


@pytest.fixture
def prometheus(served: int, tmp_path: Path) -> Iterator[Prometheus]:
    binary = built_by("build-binaries.sh", "prometheus")
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(json.dumps({  # JSON is YAML
        "global": {"scrape_interval": f"{SCRAPE_SECONDS}s", "evaluation_interval": f"{SCRAPE_SECONDS}s"},
        "scrape_configs": [{"job_name": "disttrain-operator",
                            "static_configs": [{"targets": [f"127.0.0.1:{served}"]}]}]}))
    log = open(tmp_path / "prometheus.log", "wb")  # noqa: SIM115 - the child writes to it
    proc = subprocess.Popen([str(binary), f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
    log.close()
    prom = Prometheus(port)
    try:
        wait_for(lambda: proc.poll() is None and get_json(f"{prom.base}/api/v1/status/buildinfo"), 60,
                 "Prometheus to serve its API")
        yield prom
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def panel_queries(namespace: str, job: str) -> list[tuple[str, str]]:
    """(panel title, PromQL) for every target, with Grafana's variables filled in as a user who picked
    this job would have them."""
    dashboard = rendered_dashboard()
    fill = {"$namespace": namespace, "$job": job, "$__rate_interval": RATE_INTERVAL}
    out = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", ()):  # a row has none
            expr = target["expr"]
            for var, value in fill.items():
                expr = expr.replace(var, value)
            out.append((panel["title"], expr))
    return out


# Late in its session: `make test` builds what it needs beside the lanes (hack/testlanes.py).
@pytest.mark.late
def test_every_dashboard_panel_returns_data_for_a_running_job(cluster: Cluster, namespace: str,
                                                              prometheus: Prometheus, tmp_path: Path) -> None:
    # A scrape before the job exists: its counters' increase is measured from there.
    wait_for(lambda: prometheus.query('disttrain_jobs_created_total{job="disttrain-operator"}'), 60,
             "a first scrape of the operator")
    cluster.apply(mwms_job("watched", workers=2), namespace)
    wait_pods_running(cluster, namespace, "watched", 2)
    cluster.wait_phase(namespace, "watched", "Running")
    # Its worker 0 reports training progress (the Training row's curves), twice: a curve has two points.
    volume = progress_volume(cluster, namespace, "watched-worker-0", tmp_path / "progress")
    for epoch, (loss, accuracy) in enumerate(((0.8, 0.4), (0.3, 0.85)), start=1):
        report = {"epoch": epoch, "totalEpochs": 4, "metrics": {"loss": loss, "accuracy": accuracy}}
        assert post_report(volume, report)[0] == 202
        time.sleep(SCRAPE_SECONDS * 2)
    # The operator's target is up and has reported the job as Running in a scraped sample.
    wait_for(lambda: prometheus.query(f'disttrain_job_phase{{job_name="watched", job_namespace="{namespace}", '
                                      f'phase="Running"}} == 1'), 60, "a scrape that shows the job Running")
    # rate() and increase() need two samples inside their window after the first transitions.
    queries = panel_queries(namespace, "watched")

    def answers() -> dict[str, list[dict[str, Any]]] | None:
        got = {e: prometheus.query(e) for _, e in queries}
        return got if all(got.values()) else None

    results = wait_for(answers, 60, "every panel's query to return data")
    print()
    for title, expr in queries:
        values = ", ".join(f"{dict(sorted((k, v) for k, v in r['metric'].items() if k not in ('instance', 'job')))}"
                           f" {r['value'][1]}" for r in results[expr])
        print(f"{title}: {expr} -> {values}")
    by_phase = next(e for _, e in queries if e.startswith("sum by (phase)"))
    assert {r["metric"]["phase"]: float(r["value"][1]) for r in results[by_phase]}["Running"] == 1
    # Numbers, not just series: the job's creation is in the window, and so are reconciles.
    value = {e: float(results[e][0]["value"][1]) for _, e in queries if len(results[e]) == 1}
    created = next(e for e in value if "disttrain_jobs_created_total" in e)
    pods_created = next(e for e in value if "disttrain_pods_created_total" in e)
    p95 = next(e for e in value if e.startswith("histogram_quantile(0.95"))
    assert value[created] > 0 and value[pods_created] > 0 and value[p95] == value[p95], value  # NaN != NaN
    # The dashboard's template variables: label_values(disttrain_job_phase, ...).
    assert namespace in prometheus.label_values("job_namespace", "disttrain_job_phase")
    assert prometheus.label_values("job_name", f'disttrain_job_phase{{job_namespace=~"{namespace}"}}') == ["watched"]
