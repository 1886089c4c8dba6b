"""Helpers for tests against a real API server: kubectl, a client, waiting, finishing pods."""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import pytest
import yaml
from kubernetes import client, config

from crdserved import served
from kwokpods import finish_pod

ROOT = Path(__file__).resolve().parent.parent
CRD_FILE = ROOT / "crds" / "disttrainjobs.disttrain.dev.yaml"
CHART = ROOT / "charts" / "disttrain-operator"
HELM = ROOT / ".cache" / "bin" / "helm"
# The session's operator runs as the chart's ServiceAccount (release "session" in this namespace;
# not "dt", which the chart's own tests install: its ClusterRoles would collide), so that every
# test is also a test of the chart's RBAC (tests/integration/test_rbac_audit.py).
OPERATOR_NAMESPACE = "disttrain-system"
OPERATOR_RELEASE = "session"
OPERATOR_SERVICE_ACCOUNT = f"{OPERATOR_RELEASE}-disttrain-operator"
T = TypeVar("T")


def kubectl_binary() -> str:
    """The kubectl built with the control plane (same minor version), else the installed one."""
    built = ROOT / ".cache" / "bin" / "kubectl"
    return os.environ.get("KUBECTL") or (str(built) if built.exists() else shutil.which("kubectl") or "kubectl")


def wait_for(check: Callable[[], T | Literal[False] | None], timeout: float = 30, what: str = "condition",
             interval: float = 0.1) -> T:
    """The first truthy value `check` returns; an assertion failure after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            value = check()
            if value:
                return value
            last = value
        except (AssertionError, client.ApiException) as err:  # not there yet
            last = err
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {last!r}")
        time.sleep(interval)


@dataclass
class Cluster:
    kubeconfig: Path
    local: Any = None  # the LocalCluster when the tests started one (its processes can be paused)
    _api: client.ApiClient | None = field(default=None, repr=False)

    @property
    def api(self) -> client.ApiClient:
        if self._api is None:
            self._api = config.new_client_from_config(config_file=str(self.kubeconfig))
        return self._api

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)

    @contextlib.contextmanager
    def paused(self, component: str) -> Iterator[None]:
        """Stop a control-plane process (SIGSTOP) for the block: the garbage collector of a busy
        cluster, say. Only on the local plane the tests started."""
        if self.local is None:
            pytest.skip(f"pausing {component} needs the local control plane")
        pid = self.local.processes[component]
        os.killpg(pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.killpg(pid, signal.SIGCONT)

    def env(self) -> dict[str, str]:
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig)}

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([kubectl_binary(), *args], input=input, capture_output=True, text=True,
                              env=self.env(), timeout=120)
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({proc.returncode}): {proc.stderr}")
        return proc

    def apply(self, manifest: dict[str, Any] | str, namespace: str | None = None, check: bool = True,
              server_side: bool = True) -> subprocess.CompletedProcess[str]:
        text = manifest if isinstance(manifest, str) else yaml.safe_dump(manifest)
        args = ["apply", "--server-side", "-f", "-"] if server_side else ["apply", "-f", "-"]
        if namespace:
            args += ["-n", namespace]
        return self.kubectl(*args, input=text, check=check)

    # -- pods ----------------------------------------------------------------------------------

    def pods(self, namespace: str, selector: str = "") -> list[client.V1Pod]:
        return list(self.core.list_namespaced_pod(namespace, label_selector=selector).items)

    def finish_pod(self, namespace: str, name: str, exit_code: int, uid: str | None = None) -> bool:
        """Make a KWOK pod's containers exit with `exit_code`; False if the pod had already ended
        (the operator deleted or replaced it): see hack/kwokpods.py."""
        return finish_pod(self.core, namespace, name, exit_code, uid)

    # -- jobs ----------------------------------------------------------------------------------

    def job(self, namespace: str, name: str) -> dict[str, Any]:
        obj: dict[str, Any] = self.custom.get_namespaced_custom_object(
            "disttrain.dev", "v1", namespace, "disttrainjobs", name)
        return obj

    def job_status(self, namespace: str, name: str) -> dict[str, Any]:
        return dict(self.job(namespace, name).get("status") or {})

    def wait_phase(self, namespace: str, name: str, phase: str, timeout: float = 30) -> dict[str, Any]:
        return wait_for(lambda: (s := self.job_status(namespace, name)).get("phase") == phase and s,
                        timeout, f"job {name} phase {phase}")

    def events(self, namespace: str, name: str) -> list[client.CoreV1Event]:
        return list(self.core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}").items)

    def wait_event(self, namespace: str, name: str, match: Callable[[client.CoreV1Event], bool],
                   what: str, timeout: float = 15) -> client.CoreV1Event:
        """The first event of `name` that `match`es. The operator posts events just after the
        status write they describe, so a test that has seen the phase must wait for the event."""
        return wait_for(lambda: next((e for e in self.events(namespace, name) if match(e)), None), timeout, what)


class OperatorProcess:
    """The operator as users run it: `python -m disttrain run`, in its own process."""

    def __init__(self, cluster: Cluster, log_path: Path, extra_args: tuple[str, ...] = ()) -> None:
        self.cluster, self.log_path, self.extra_args = cluster, log_path, extra_args
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child writes to it
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "disttrain", "run", *self.extra_args],
            stdout=log, stderr=subprocess.STDOUT, env=self.cluster.env(), start_new_session=True)
        log.close()

    def kill(self) -> None:
        """SIGKILL: no cleanup, as when a node dies under the operator."""
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def log_times(log: str, text: str) -> list[float]:
    """Wall times of the operator's log lines (asctime first: __main__._configure_logging) that
    contain `text`."""
    times = []
    for line in log.splitlines():
        found = LOG_TIME.match(line)
        if found and text in line:
            times.append(datetime.datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp())
    return times


def job_columns(cluster: Cluster, ns: str, job: str, wide: bool = True) -> dict[str, str]:
    """`kubectl get dtj JOB` as {column: value}, read by the header's positions (a cell kubectl
    leaves empty, such as PROGRESS% before any report or COMPLETED while the job runs, would shift
    a split())."""
    header, row = cluster.kubectl("get", "disttrainjobs", job, "-n", ns,
                                  *(("-o", "wide") if wide else ())).stdout.splitlines()[:2]
    starts = [i for i, c in enumerate(header) if c != " " and (i == 0 or header[i - 1] == " ")]
    return {header[a:b].strip(): row[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)}


def helm(cluster: Cluster, *args: str) -> str:
    result = subprocess.run([str(HELM), *args], capture_output=True, text=True, env=cluster.env(), timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


def service_account_kubeconfig(cluster: Cluster, path: Path, namespace: str, service_account: str) -> Path:
    """A kubeconfig with a token of `service_account` (TokenRequest, as the kubelet gets one for a
    pod): the API server authenticates, authorizes and audits its requests as that account.
    (Impersonation would not do for the audit: the policy is matched before impersonation.)"""
    token = cluster.kubectl("create", "token", service_account, "--namespace", namespace,
                            "--duration", "48h").stdout.strip()
    config = yaml.safe_load(cluster.kubeconfig.read_text())
    for user in config["users"]:
        user["user"] = {"token": token}
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


TIMED: list[str] = []  # this run's timings, printed at the end of the run (conftest.py)


def pinned_versions() -> dict[str, str]:
    """hack/versions.env, as {name: value}."""
    return dict(line.split("=", 1) for line in (ROOT / "hack" / "versions.env").read_text().splitlines()
                if line and not line.startswith("#"))


def record_timing(kind: str, name: str, seconds: float) -> None:
    """A measured time, for the closing notes and README: printed (`pytest -s`, CI's log) and kept in
    `.cache/<kind>-timings.json` across runs."""
    path = ROOT / ".cache" / f"{kind}-timings.json"
    timings = json.loads(path.read_text()) if path.exists() else {}
    timings[name] = round(seconds, 2)
    path.write_text(json.dumps(timings, indent=2))
    TIMED.append(f"{kind}: {name}: {seconds:.2f}s")


def rendered_dashboard() -> dict[str, Any]:
    """The Grafana dashboard as the chart renders it offline (`dashboard.enabled=true`), checked to
    be the one ConfigMap with the label Grafana's sidecar looks for."""
    result = subprocess.run([str(HELM), "template", "dt", str(CHART), "--set", "dashboard.enabled=true"],
                            capture_output=True, text=True, timeout=60,
                            env={**os.environ, "KUBECONFIG": "/nonexistent"})
    assert result.returncode == 0, result.stderr
    maps = [d for d in yaml.safe_load_all(result.stdout) if d and d["kind"] == "ConfigMap"]
    assert len(maps) == 1 and maps[0]["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard: dict[str, Any] = json.loads(maps[0]["data"]["disttrain.json"])
    return dashboard


def chart_identity(cluster: Cluster, tmp: Path) -> Cluster:
    """The chart's ServiceAccount, RBAC and the policy narrowing its pod patches (not its Deployment)
    applied in OPERATOR_NAMESPACE, and the cluster as seen with that account's token: what the chart's
    operator pod may do."""
    cluster.kubectl("create", "namespace", OPERATOR_NAMESPACE, check=False)
    rendered = helm(cluster, "template", OPERATOR_RELEASE, str(CHART), "--namespace", OPERATOR_NAMESPACE,
                    "--kube-version", "1.36.3", "--show-only", "templates/serviceaccount.yaml",
                    "--show-only", "templates/rbac.yaml", "--show-only", "templates/pod-patch-policy.yaml")
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=rendered)
    kubeconfig = service_account_kubeconfig(cluster, tmp / "operator.kubeconfig", OPERATOR_NAMESPACE,
                                            OPERATOR_SERVICE_ACCOUNT)
    return Cluster(kubeconfig=kubeconfig, local=cluster.local)


def built_by(script: str, *args: str) -> Path:
    """What a hack/ build script prints last, once built: `make test` builds it beside its lanes
    (hack/testlanes.py), and the script waits on that build's lock, then finds it built; run alone,
    it builds it (minutes)."""
    built = subprocess.run([str(ROOT / "hack" / script), *args], cwd=ROOT, capture_output=True, text=True,
                           check=False)
    assert built.returncode == 0, f"hack/{script} {' '.join(args)}: exit {built.returncode}\n{built.stderr[-3000:]}"
    return Path(built.stdout.strip().splitlines()[-1])


def install_crd(cluster: Cluster) -> None:
    """The DistTrainJob CRD, applied and served (hack/crdserved.py: established is not served)."""
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_FILE))
    crd = yaml.safe_load(CRD_FILE.read_text())

    def get(api_path: str) -> Any:
        return json.loads(cluster.kubectl("get", "--raw", api_path).stdout or "null")
    wait_for(lambda: served(get, crd), 60, "the DistTrainJob CRD served")


@contextlib.contextmanager
def fresh_namespace(cluster: Cluster) -> Iterator[str]:
    """A namespace of the test's own (`t-<random>`), ready for objects, deleted after the block."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    cluster.core.create_namespace({"metadata": {"name": name}})
    wait_namespace_ready(cluster, name)
    try:
        yield name
    finally:
        cluster.core.delete_namespace(name)


def wait_namespace_ready(cluster: Cluster, namespace: str) -> None:
    """Pods can be made in `namespace` once its default ServiceAccount exists."""
    wait_for(lambda: cluster.core.list_namespaced_service_account(namespace).items, 30,
             f"the default ServiceAccount in {namespace}")


def pod_names(cluster: Cluster, ns: str, job: str) -> list[str]:
    """Names of the job's pods that are not being deleted, sorted."""
    return sorted(p.metadata.name for p in cluster.pods(ns, f"disttrain.dev/job-name={job}")
                  if p.metadata.deletion_timestamp is None)


def wait_pods_running(cluster: Cluster, ns: str, job: str, count: int, timeout: float = 30) -> list[client.V1Pod]:
    """The job's `count` pods once every one of them is Running (and none is being deleted)."""
    def running() -> list[client.V1Pod] | None:
        pods = [p for p in cluster.pods(ns, f"disttrain.dev/job-name={job}") if p.metadata.deletion_timestamp is None]
        return pods if len(pods) == count and all(p.status.phase == "Running" for p in pods) else None
    return wait_for(running, timeout, f"{count} running pods of {job}")


def pod_env(pod: client.V1Pod, name: str, container: int = 0) -> str | None:
    for env in pod.spec.containers[container].env or []:
        if env.name == name:
            return str(env.value)
    return None


def tf_config(pod: client.V1Pod) -> dict[str, Any]:
    value = pod_env(pod, "TF_CONFIG")
    assert value is not None, f"{pod.metadata.name} has no TF_CONFIG"
    loaded: dict[str, Any] = json.loads(value)
    return loaded


HOROVODRUN_PREFIX = re.compile(r"^\[\d+\]<std(?:out|err)>:")


class LogFollower:
    """`kubectl logs -f` of one pod, collected as it arrives: a pod the operator deletes (the
    job finished, or restarts) takes its log with it."""

    def __init__(self, cluster: Cluster, namespace: str, pod: str) -> None:
        self.pod = pod
        self.lines: list[str] = []
        self.proc = subprocess.Popen([kubectl_binary(), "logs", "-f", "-n", namespace, pod], env=cluster.env(),
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def events(self) -> list[dict[str, Any]]:
        """The JSON lines the examples print (horovodrun's `[rank]<stdout>:` prefix dropped)."""
        found: list[dict[str, Any]] = []
        decoder = json.JSONDecoder()
        for line in (HOROVODRUN_PREFIX.sub("", each) for each in list(self.lines)):
            at = 0  # two ranks' lines run together where a script writes a line in two writes
            while line.startswith("{", at):
                try:
                    event, at = decoder.raw_decode(line, at)
                except ValueError:
                    break
                if isinstance(event, dict):
                    found.append(event)
        return found

    def wait_event(self, match: Callable[[dict[str, Any]], bool], what: str, timeout: float = 300) -> dict[str, Any]:
        try:
            return wait_for(lambda: next((e for e in self.events() if match(e)), None), timeout,
                            f"{what} in the log of {self.pod}", interval=0.5)
        except AssertionError as err:
            # What the container said last, and whether its stream ended (the container exited:
            # `kubectl logs -f` follows one container's run, not the kubelet's restart of it).
            ended = "its log ended" if self.proc.poll() is not None else "its log still open"
            tail = " | ".join(self.lines[-6:])[-1500:]
            raise AssertionError(f"{err} ({ended}; its last lines: {tail})") from None

    def stop(self) -> str:
        """Stop following (if the stream hasn't ended by itself); the whole log."""
        if self.proc.poll() is None:
            self.proc.terminate()
        self.proc.wait()
        self.thread.join(timeout=5)
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        return "\n".join(self.lines)
