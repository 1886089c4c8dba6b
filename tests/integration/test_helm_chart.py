"""The Helm chart: lint, server-side validation of several value sets, install, and proof that
its RBAC is enough: the operator, run with a token of the chart's ServiceAccount, takes a
TensorFlow job and an MPI job to Succeeded."""

from __future__ import annotations

import os
import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from manifests import mpi_job, mwms_job
from support import (
    CHART,
    CRD_FILE,
    HELM,
    Cluster,
    OperatorProcess,
    helm,
    log_times,
    rendered_dashboard,
    service_account_kubeconfig,
    wait_for,
    wait_namespace_ready,
    wait_pods_running,
)

VALUE_SETS = {
    "defaults": [],
    "ha": ["--set", "replicaCount=2"],
    "ha-namespaced": ["--set", "replicaCount=3", "--set", "watchNamespaces={team-a}"],
    "namespaced": ["--set", "watchNamespaces={team-a,team-b}"],
    "no-metrics": ["--set", "metrics.enabled=false", "--set", "serviceAccount.name=custom"],
    "dashboard": ["--set", "dashboard.enabled=true", "--set", "dashboard.annotations.grafana_folder=ML"],
}


def test_chart_crd_is_the_same_as_crds_folder() -> None:
    assert (CHART / "crds" / CRD_FILE.name).read_text() == CRD_FILE.read_text(), "run `make crd`"


def test_helm_lint(cluster: Cluster) -> None:
    for args in VALUE_SETS.values():
        helm(cluster, "lint", "--strict", str(CHART), *args)


@pytest.mark.parametrize("values", list(VALUE_SETS))
def test_rendered_chart_passes_server_side_dry_run(crd: Cluster, values: str) -> None:
    ns = f"chart-{values}"
    namespaces = [ns, "team-a", "team-b"] if "namespaced" in values else [ns]
    for name in namespaces:
        crd.kubectl("create", "namespace", name, check=False)
    rendered = helm(crd, "template", "dt", str(CHART), "--namespace", ns, "--kube-version", "1.36.3",
                    *VALUE_SETS[values])
    result = crd.kubectl("apply", "--dry-run=server", "-f", "-", input=rendered)
    kinds = {doc["kind"] for doc in yaml.safe_load_all(rendered) if doc}
    assert {"Deployment", "ServiceAccount"} <= kinds
    deployment = next(d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "Deployment")
    assert "--leader-election" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "dry run" in result.stdout


def test_values_schema_rejects_nonsense(cluster: Cluster) -> None:
    bad = subprocess.run([str(HELM), "template", "dt", str(CHART), "--set", "replicaCount=0"],
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "replicaCount" in bad.stderr


def test_helm_template_renders_with_no_flags() -> None:
    """No cluster, no --kube-version: what `helm template | kubectl apply` and GitOps tools run."""
    result = subprocess.run([str(HELM), "template", str(CHART)], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "KUBECONFIG": "/nonexistent"})
    assert result.returncode == 0, result.stderr
    kinds = [doc["kind"] for doc in yaml.safe_load_all(result.stdout) if doc]
    assert "Deployment" in kinds and "ConfigMap" not in kinds  # the dashboard is off by default


def test_progress_pods_names_the_charts_own_pods() -> None:
    """Issue 32: a PeersAndDNS job's policy lets its reporter reach the pods `--progress-pods` names;
    rendered by the chart, they are its Deployment's pods (their selector) in the release's namespace,
    on the progress port the Service targets."""
    from disttrain.__main__ import _endpoint_pods

    result = subprocess.run([str(HELM), "template", "rel", str(CHART), "-n", "ops"], capture_output=True, text=True,
                            timeout=60, env={**os.environ, "KUBECONFIG": "/nonexistent"})
    assert result.returncode == 0, result.stderr
    deployment = next(d for d in yaml.safe_load_all(result.stdout) if d and d["kind"] == "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    flags = dict(a.removeprefix("--").split("=", 1) for a in args if a.startswith("--") and "=" in a)
    pods = _endpoint_pods(flags["progress-pods"], int(flags["progress-port"]))
    assert (pods.namespace, dict(pods.labels)) == ("ops", deployment["spec"]["selector"]["matchLabels"])


def test_kueue_rbac_grants_kueue_what_multikueue_does_on_our_kind(crd: Cluster) -> None:
    """kueue.rbac.enabled: Kueue's controller may read jobs and write their status (a manager) and
    make, watch and delete them (a worker), as its generic MultiKueue adapter does."""
    rendered = helm(crd, "template", "dt", str(CHART), "--set", "kueue.rbac.enabled=true",
                    "--show-only", "templates/kueue-rbac.yaml")
    assert "rbac.kueue.x-k8s.io/batch-admin" in rendered
    crd.kubectl("apply", "--server-side", "-f", "-", input=rendered)
    try:
        kueue = "system:serviceaccount:kueue-system:kueue-controller-manager"
        for verb in ("get", "list", "watch", "create", "delete"):
            assert crd.kubectl("auth", "can-i", verb, "disttrainjobs.disttrain.dev", "--all-namespaces",
                               "--as", kueue, check=False).stdout.strip() == "yes", verb
        assert crd.kubectl("auth", "can-i", "patch", "disttrainjobs.disttrain.dev", "--subresource=status",
                           "-n", "default", "--as", kueue, check=False).stdout.strip() == "yes"
        assert crd.kubectl("auth", "can-i", "delete", "pods", "-n", "default", "--as", kueue,
                           check=False).stdout.strip() == "no", "nothing but our kind"
        # Issue 31: nothing the adapter doesn't call (it never updates or patches a job's spec).
        for verb, sub in (("update", ()), ("patch", ()), ("update", ("--subresource=status",))):
            assert crd.kubectl("auth", "can-i", verb, "disttrainjobs.disttrain.dev", *sub, "-n", "default",
                               "--as", kueue, check=False).stdout.strip() == "no", (verb, sub)
    finally:
        crd.kubectl("delete", "-f", "-", input=rendered, check=False)


def exported_metric_names() -> set[str]:
    """Every series name the operator's /metrics can carry (a labelled gauge with no job yet
    still declares its family)."""
    import prometheus_client

    import disttrain.runtime.metrics  # noqa: F401  (registers them)

    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_count", "_sum"], "gauge": [""]}
    return {family.name + suffix for family in prometheus_client.REGISTRY.collect()
            if family.name.startswith("disttrain_") for suffix in suffixes.get(family.type, [""])}


PROMQL_KEYWORDS = {"and", "or", "unless", "bool", "offset", "on", "ignoring", "group_left", "group_right"}


def metrics_in(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: identifiers that are neither functions (before
    a parenthesis), keywords (`or vector(0)`), nor inside label matchers, groupings, ranges or strings."""
    stripped = re.sub(r'"[^"]*"|\{[^}]*\}|\[[^\]]*\]|\b(by|without)\s*\([^)]*\)', " ", expr)
    return {name for name, call in re.findall(r"([A-Za-z_:][A-Za-z0-9_:]*)\s*(\()?", stripped)
            if not call and name not in PROMQL_KEYWORDS}


def test_dashboard_renders_valid_json_naming_only_exported_metrics() -> None:
    dashboard = rendered_dashboard()
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", ())]  # a row has none
    queries = [v["query"]["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    exported = exported_metric_names()
    for expr in exprs:
        assert metrics_in(expr) and metrics_in(expr) <= exported, (expr, metrics_in(expr) - exported)
    for query in queries:  # label_values(<metric>{...}, <label>)
        assert re.match(r"label_values\((\w+)", query).group(1) in exported, query  # type: ignore[union-attr]
    for gauge in ("disttrain_job_phase", "disttrain_job_pods_ready", "disttrain_job_pods_desired",
                  "disttrain_job_restarts", "disttrain_job_seconds_to_running", "disttrain_job_progress_percent",
                  "disttrain_job_metric", "disttrain_job_stalled", "disttrain_job_usage_seconds_total"):
        assert any(gauge in e for e in exprs), f"no panel shows {gauge}"


def test_helm_install_dry_runs_and_upgrade(crd: Cluster, installed: str) -> None:
    release_ns = f"dry-{uuid.uuid4().hex[:6]}"
    client_side = helm(crd, "install", "dry", str(CHART), "--namespace", release_ns, "--dry-run")
    server_side = helm(crd, "install", "dry", str(CHART), "--namespace", release_ns, "--dry-run=server")
    for out in (client_side, server_side):
        assert "STATUS: pending-install" in out and "kind: Deployment" in out
    upgraded = helm(crd, "upgrade", "dt", str(CHART), "--namespace", installed, "--set", "replicaCount=2")
    assert "REVISION: 2" in upgraded, upgraded
    replicas = crd.kubectl("get", "deployment", "dt-disttrain-operator", "-n", installed, "-o",
                           "jsonpath={.spec.replicas}").stdout
    assert replicas == "2"


@pytest.fixture
def installed(crd: Cluster, tmp_path: Path) -> Iterator[str]:
    release_ns = f"dt-{uuid.uuid4().hex[:6]}"
    helm(crd, "install", "dt", str(CHART), "--namespace", release_ns, "--create-namespace", "--wait=false")
    yield release_ns
    helm(crd, "uninstall", "dt", "--namespace", release_ns)
    crd.kubectl("delete", "namespace", release_ns, "--wait=false")


def run_operator_as_chart(cluster: Cluster, tmp: Path, release_ns: str, *args: str) -> OperatorProcess:
    sa = "dt-disttrain-operator"
    assert cluster.core.read_namespaced_service_account(sa, release_ns)
    as_chart = Cluster(kubeconfig=service_account_kubeconfig(cluster, tmp / "chart.kubeconfig", release_ns, sa))
    operator = OperatorProcess(as_chart, tmp / "chart-operator.log", args)
    operator.start()
    return operator


def test_chart_rbac_runs_tensorflow_and_mpi_jobs(cluster: Cluster, installed: str, namespace: str,
                                                  tmp_path: Path, operator: OperatorProcess) -> None:
    operator.stop()  # the session's admin operator must not do the work for us
    # The Deployment's arguments: the Lease in the release's namespace must be within its RBAC too.
    chart_operator = run_operator_as_chart(cluster, tmp_path, installed, "--leader-election",
                                           "--leader-election-namespace", installed,
                                           "--lease-name", "dt-disttrain-operator")
    try:
        cluster.apply(mwms_job("rbac-tf", workers=2), namespace)
        cluster.apply(mpi_job("rbac-mpi", workers=2, gpus=1), namespace)
        wait_pods_running(cluster, namespace, "rbac-tf", 2)
        wait_pods_running(cluster, namespace, "rbac-mpi", 3, timeout=60)
        for i in range(2):
            cluster.finish_pod(namespace, f"rbac-tf-worker-{i}", 0)
        cluster.finish_pod(namespace, "rbac-mpi-launcher", 0)
        cluster.wait_phase(namespace, "rbac-tf", "Succeeded")
        cluster.wait_phase(namespace, "rbac-mpi", "Succeeded")
        assert "Forbidden" not in chart_operator.log() and "403" not in chart_operator.log(), chart_operator.log()
        assert "became the leader" in chart_operator.log()
    finally:
        chart_operator.stop()
        operator.start()


def test_watch_namespaces_leaves_other_namespaces_alone(cluster: Cluster, tmp_path: Path,
                                                         operator: OperatorProcess) -> None:
    operator.stop()
    watched, other = f"w-{uuid.uuid4().hex[:6]}", f"o-{uuid.uuid4().hex[:6]}"
    release_ns = f"dtn-{uuid.uuid4().hex[:6]}"
    for ns in (watched, other):
        cluster.kubectl("create", "namespace", ns)
    helm(cluster, "install", "dt", str(CHART), "--namespace", release_ns, "--create-namespace",
         "--set", f"watchNamespaces={{{watched}}}")
    chart_operator = run_operator_as_chart(cluster, tmp_path, release_ns, "--namespace", watched)
    try:
        for ns in (watched, other):
            wait_namespace_ready(cluster, ns)
            cluster.apply(mwms_job("scoped", workers=1), ns)
        wait_pods_running(cluster, watched, "scoped", 1)
        cluster.wait_phase(watched, "scoped", "Running")
        assert not cluster.pods(other, "disttrain.dev/job-name=scoped")
        assert not cluster.job_status(other, "scoped")
        assert "Forbidden" not in chart_operator.log(), chart_operator.log()
    finally:
        chart_operator.stop()
        helm(cluster, "uninstall", "dt", "--namespace", release_ns)
        for ns in (watched, other, release_ns):
            cluster.kubectl("delete", "namespace", ns, "--wait=false")
        operator.start()


def test_two_replicas_elect_one_leader_and_fail_over(cluster: Cluster, namespace: str, tmp_path: Path,
                                                     operator: OperatorProcess) -> None:
    from ports import free_port

    operator.stop()
    lease = f"dt-{namespace}"
    args = ("--leader-election", "--leader-election-namespace", namespace, "--lease-name", lease,
            "--lease-duration", "6")
    ports = [free_port(), free_port()]
    replicas = [OperatorProcess(cluster, tmp_path / f"replica-{i}.log", (*args, "--health-port", str(ports[i])))
                for i in range(2)]
    try:
        for replica in replicas:
            replica.start()
        wait_for(lambda: sum("became the leader" in r.log() for r in replicas) == 1
                 and any("standing by" in r.log() for r in replicas), 60, "one leader, one standby")
        leader = next(r for r in replicas if "became the leader" in r.log())
        standby = next(r for r in replicas if r is not leader)
        # The chart's probes: a standby is alive (issue 31: it served nothing, and its liveness probe
        # restarted it every ~70 s) but not ready; the leader is both.
        leader_port, standby_port = (ports[replicas.index(r)] for r in (leader, standby))
        wait_for(lambda: probe(leader_port, "/readyz") == 200, 30, "the leader ready")
        assert (probe(standby_port, "/healthz"), probe(standby_port, "/readyz")) == (200, 503)
        cluster.apply(mwms_job("elected", workers=2), namespace)
        wait_pods_running(cluster, namespace, "elected", 2)
        assert "job-name=elected" not in standby.log()
        leader.kill()  # no chance to hand over: the standby takes the Lease once it expires
        wait_for(lambda: "became the leader" in standby.log(), 60, "the standby to take over")
        wait_for(lambda: probe(standby_port, "/readyz") == 200, 30, "the new leader ready")
        cluster.finish_pod(namespace, "elected-worker-0", 0)
        cluster.wait_phase(namespace, "elected", "Succeeded")
        holder = cluster.kubectl("get", "lease", lease, "-n", namespace, "-o",
                                 "jsonpath={.spec.holderIdentity} {.spec.leaseTransitions}").stdout.split()
        assert holder[1] == "1"
        # A leader asked to stop (SIGTERM: a rollout, a drain) hands over: it releases the Lease once
        # kopf has stopped, and the standby leads at its next try (2 s), inside the Lease's 6 s.
        leader.start()  # the killed replica back, standing by
        wait_for(lambda: leader.log().count("standing by") == 1, 60, "the restarted replica standing by")
        standby.stop()
        wait_for(lambda: leader.log().count("became the leader") == 2, 30, "the standby to take over")
        assert "released Lease" in standby.log()
        released = log_times(standby.log(), "releasing Lease")[-1]
        took = log_times(leader.log(), "became the leader")[-1] - released
        print(f"\nhanded over: the standby led {took:.2f}s after the leader released the Lease")
        assert took < 4, f"the Lease was left to expire (6 s): {took:.1f}s"
        holder = cluster.kubectl("get", "lease", lease, "-n", namespace, "-o",
                                 "jsonpath={.spec.holderIdentity} {.spec.leaseTransitions}").stdout.split()
        assert holder[1] == "2"
    finally:
        for replica in replicas:
            replica.stop()
        operator.start()


def probe(port: int, path: str) -> int:
    """The status of a GET, as a kubelet's httpGet probe reads it (0: nothing listening)."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as err:
        return err.code
    except OSError:
        return 0


def test_health_and_metrics_endpoints(cluster: Cluster, namespace: str, tmp_path: Path,
                                      operator: OperatorProcess) -> None:
    """What the chart's probes and ServiceMonitor read: kopf's /healthz and prometheus metrics."""
    import urllib.request

    from ports import free_port

    health, metrics = free_port(), free_port()
    operator.stop()
    served = OperatorProcess(cluster, tmp_path / "served.log", ("--health-port", str(health),
                                                                "--metrics-port", str(metrics)))
    served.start()
    try:
        def get(url: str) -> str:
            try:
                with urllib.request.urlopen(url, timeout=5) as resp:
                    return str(resp.read().decode())
            except OSError:  # not listening yet
                return ""
        wait_for(lambda: get(f"http://127.0.0.1:{health}/healthz"), 60, "liveness endpoint")
        cluster.apply(mwms_job("metered", workers=2), namespace)
        wait_pods_running(cluster, namespace, "metered", 2)
        text = wait_for(lambda: (t := get(f"http://127.0.0.1:{metrics}/metrics")) and
                        "disttrain_pods_created_total 2.0" in t and t, 30, "metrics")
        assert "disttrain_jobs_created_total 1.0" in text
        assert "disttrain_reconcile_duration_seconds_count" in text

        def job_series() -> dict[tuple[str, str], float]:
            """This job's per-job series: (name, phase) -> value."""
            from prometheus_client.parser import text_string_to_metric_families

            text = get(f"http://127.0.0.1:{metrics}/metrics")
            assert text, "metrics endpoint"
            return {(s.name, s.labels.get("phase", "")): s.value for f in text_string_to_metric_families(text)
                    for s in f.samples if s.labels.get("job_name") == "metered"
                    and s.labels.get("job_namespace") == namespace}
        series = wait_for(lambda: (got := job_series()).get(("disttrain_job_phase", "Running")) == 1 and got, 30,
                          "per-job gauges")
        assert ("disttrain_job_phase", "Pending") not in series  # one phase series per job: its own
        assert series[("disttrain_job_pods_ready", "")] == series[("disttrain_job_pods_desired", "")] == 2
        assert series[("disttrain_job_restarts", "")] == 0
        assert series[("disttrain_job_seconds_to_running", "")] >= 0
        cluster.kubectl("delete", "disttrainjob", "metered", "-n", namespace)
        wait_for(lambda: not job_series(), 30, "the deleted job's series to go")
    finally:
        served.stop()
        operator.start()


def test_the_operator_may_patch_a_pod_only_for_its_discovery_annotation(cluster: Cluster, namespace: str,
                                                                         operator: OperatorProcess) -> None:
    """Issue 31: RBAC grants `patch` on pods whole and cluster-wide, for an annotation on a launcher
    (and, issue 33, a checkpoint request on a job's pods). The chart's policy (templates/pod-patch-
    policy.yaml, applied with the session's RBAC) lets the operator's ServiceAccount change those
    annotations on a DistTrainJob's pod, and nothing else of it, nor anything of any other pod."""
    as_operator = operator.cluster  # the chart's ServiceAccount's token (conftest: chart_identity)
    cluster.apply(mwms_job("patched", workers=2), namespace)
    wait_pods_running(cluster, namespace, "patched", 2)
    cluster.kubectl("run", "bare", "-n", namespace, "--image", "busybox", "--restart", "Never")  # any pod

    def change(pod: str, *what: str) -> subprocess.CompletedProcess[str]:
        return as_operator.kubectl(what[0], "pod", pod, "-n", namespace, "--overwrite", *what[1:], check=False)

    for annotation in ("disttrain.dev/discovery=abc", "disttrain.dev/checkpoint-request=c20261122-120000-000000"):
        allowed = change("patched-worker-0", "annotate", annotation)
        assert allowed.returncode == 0, allowed.stderr
    for pod, what in (("patched-worker-0", ("label", "stolen=yes")),
                      ("patched-worker-0", ("annotate", "other=1")),
                      ("bare", ("annotate", "disttrain.dev/discovery=abc"))):
        refused = change(pod, *what)
        assert refused.returncode != 0, f"{pod} {what}: allowed"
        assert "ValidatingAdmissionPolicy" in refused.stderr and "the disttrain operator" in refused.stderr, \
            refused.stderr
