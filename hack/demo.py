"""`make demo`: a job from `kubectl apply` to Succeeded, with real training.

Starts the local control plane, installs the Helm chart, applies
examples/multi-worker-mirrored/job.yaml and shows `kubectl get disttrainjobs` until the job
finishes.

- By default (KWOK nodes only, no containers): the operator runs here as the chart's
  ServiceAccount, and this script stands in for the kubelet: it runs each pod's command with
  real TensorFlow (TF_CONFIG exactly as the operator wrote it, host names mapped to loopback
  ports) and reports the real exit code back.
- `--real-node` (`make demo REAL_NODE=1`): a real node joins (containerd, kubelet, CoreDNS,
  kube-proxy); the operator runs from its image in its pod, and the job's pods are containers of
  the TensorFlow image, finding each other through cluster DNS. Needs root and `make images`.

The last screen is the job's wide row and its events; tests/integration/test_demo.py runs this
script and reads that screen.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "hack"))
import realnode  # noqa: E402
import registry  # noqa: E402
from kwokpods import finish_pod  # noqa: E402
from localcluster import LocalCluster, tf_configs_on_loopback  # noqa: E402

BIN = REPO / ".cache" / "bin"
TF_PYTHON = REPO / ".cache" / "tf-venv" / "bin" / "python"
EXAMPLE = REPO / "examples" / "multi-worker-mirrored" / "job.yaml"
RELEASE_NS = "disttrain-system"
NAMESPACE = "demo"
JOB_NAME = "mnist-mwms"


def sh(*args: str, env: dict[str, str], input: str | None = None, quiet: bool = False) -> str:
    result = subprocess.run(args, env=env, input=input, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed:\n{result.stderr}")
    if not quiet and result.stdout.strip():
        print(result.stdout.rstrip())
    return result.stdout


@dataclass
class Container:
    pod: str
    uid: str
    process: subprocess.Popen[bytes]
    log: Path


@dataclass
class KubeletStandIn:
    """Runs the containers of a job's pods on this machine, as the kubelet of their KWOK node would.

    The pods of one attempt start together, once all of them are Running (TF_CONFIG's addresses
    are mapped to loopback ports for the whole job at once). A container whose pod is deleted,
    or replaced by a newer pod of the same name, is stopped: that is the normal end of a pod the
    operator cleans up after the job finished, never a failure of the demo."""

    core: Any
    namespace: str
    job: str
    workdir: Path
    containers: dict[str, Container] = field(default_factory=dict)  # running now, by pod uid
    started: set[str] = field(default_factory=set)  # uids of every pod whose container ran

    def pods(self) -> list[Any]:
        return list(self.core.list_namespaced_pod(self.namespace,
                                                  label_selector=f"disttrain.dev/job-name={self.job}").items)

    def step(self, wanted: int) -> None:
        pods = self.pods()
        live = {p.metadata.uid: p for p in pods if p.metadata.deletion_timestamp is None}
        for uid, container in list(self.containers.items()):
            if uid not in live:
                container.process.terminate()
                print(f"    {container.pod}: pod deleted by the operator; container stopped")
                del self.containers[uid]
            elif container.process.poll() is not None:
                self.report_exit(container)
                del self.containers[uid]
        running = [p for p in live.values() if p.status.phase == "Running"]
        if len(running) == wanted and not self.started & {p.metadata.uid for p in running}:
            print(f"==> {wanted} pods Running on KWOK nodes; starting their containers with real TensorFlow")
            self.start(running)

    def report_exit(self, container: Container) -> None:
        code = container.process.returncode
        lines = container.log.read_text(errors="replace").strip().splitlines()
        print(f"    {container.pod}: training process exited with {code}; {lines[-1] if lines else ''}")
        if not finish_pod(self.core, self.namespace, container.pod, code, container.uid):
            # The job finished (or restarted) on another pod's exit and the operator deleted this
            # one first: a kubelet would have nothing left to report either.
            print(f"    {container.pod}: pod already deleted by the operator; exit not reported")

    def start(self, pods: list[Any]) -> None:
        """Start each pod's first container: its command, its env, TF_CONFIG on loopback."""
        configs = tf_configs_on_loopback({p.metadata.name: json.loads(env_of(p)["TF_CONFIG"]) for p in pods})
        for pod in pods:
            name, spec = pod.metadata.name, pod.spec.containers[0]
            env = env_of(pod)
            env.update(TF_CONFIG=json.dumps(configs[name]), CHECKPOINT_DIR=str(self.workdir / "checkpoints"),
                       TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="", PATH=os.environ["PATH"])
            # The image's paths, mapped onto this checkout.
            command = [str(TF_PYTHON) if c == "python" else c.replace("/opt/disttrain/", f"{REPO}/")
                       for c in spec.command]
            log = self.workdir / f"{name}.log"
            with open(log, "wb") as out:
                process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
            self.containers[pod.metadata.uid] = Container(name, pod.metadata.uid, process, log)
            self.started.add(pod.metadata.uid)

    def stop(self) -> None:
        for container in self.containers.values():
            container.process.kill()
            container.process.wait()
        self.containers.clear()


def env_of(pod: Any) -> dict[str, str]:
    return {e.name: e.value for e in pod.spec.containers[0].env or [] if e.value is not None}


def impersonating_kubeconfig(kubeconfig: Path, path: Path, service_account: str) -> Path:
    kc = yaml.safe_load(kubeconfig.read_text())
    kc["users"][0]["user"]["as"] = service_account
    path.write_text(yaml.safe_dump(kc))
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--real-node", action="store_true",
                        help="run the job in containers on a real node, the operator from its image (make node images)")
    parser.add_argument("--keep", action="store_true", help="leave the cluster running afterwards")
    parser.add_argument("--dir", type=Path, default=REPO / ".cache" / "demo", help="state folder")
    parser.add_argument("--timeout", type=float, default=600, help="seconds to wait for the job to finish")
    args = parser.parse_args()
    root = args.dir.resolve()
    cluster = LocalCluster(root=root, nodes=2, real_node=args.real_node, gang_schedulers=False,
                           kueue=False)
    what = "KWOK and a real node: containerd, kubelet, CoreDNS" if args.real_node else "KWOK"
    print(f"==> starting the local cluster (etcd, kube-apiserver, controller-manager, scheduler, {what})")
    started = time.monotonic()
    cluster.up()
    print(f"    up in {time.monotonic() - started:.1f}s; export KUBECONFIG={cluster.kubeconfig}")
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig), "PATH": f"{BIN}:{os.environ['PATH']}"}
    core = client.CoreV1Api(config.new_client_from_config(config_file=str(cluster.kubeconfig)))
    workdir = root / "pods"
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    kubelet = None if args.real_node else KubeletStandIn(core, NAMESPACE, JOB_NAME, workdir)
    operator: subprocess.Popen[bytes] | None = None
    try:
        operator = install_operator(cluster, env, root, in_cluster=args.real_node)
        apply_example(core, env, workdir, root, pinned=args.real_node)
        phase = wait_for_end(kubelet, env, time.monotonic() + args.timeout)
        print("==> kubectl get disttrainjobs -o wide; kubectl get events (the job's)")
        sh("kubectl", "get", "disttrainjobs", "-n", NAMESPACE, "-o", "wide", env=env)
        sh("kubectl", "get", "events", "-n", NAMESPACE, "--field-selector", "involvedObject.kind=DistTrainJob",
           "--sort-by=.lastTimestamp", "-o", "custom-columns=TYPE:.type,REASON:.reason,MESSAGE:.message", env=env)
        if args.real_node:
            print(f"==> kubectl logs {JOB_NAME}-worker-0 (the container's own output)")
            print(sh("kubectl", "logs", "-n", NAMESPACE, f"{JOB_NAME}-worker-0", env=env, quiet=True)
                  .rstrip().splitlines()[-1])
        if phase != "Succeeded":
            print(f"==> the job ended {phase or 'nowhere'}; pod logs in {workdir}, operator log in {root}")
        return 0 if phase == "Succeeded" else 1
    finally:
        if kubelet is not None:
            kubelet.stop()
        if operator is not None:
            operator.terminate()
            operator.wait(timeout=10)
        if args.keep:
            print(f"cluster left running: export KUBECONFIG={cluster.kubeconfig}; stop it with "
                  f"`python hack/localcluster.py down --dir {root}`")
        else:
            cluster.down()


def install_operator(cluster: LocalCluster, env: dict[str, str], root: Path,
                     in_cluster: bool) -> subprocess.Popen[bytes] | None:
    """The chart, installed. On a real node the operator runs from its image in its pod; with KWOK
    alone (no container runs), as a process here with the chart's ServiceAccount (impersonated)."""
    # On the real node the image is pulled from the plane's registry with a pull secret, as on a cluster of yours.
    pulls = registry.Registry.helm_values() if in_cluster else []
    print(f"==> helm install disttrain charts/disttrain-operator -n {RELEASE_NS} {' '.join(pulls)}".rstrip())
    if in_cluster:
        sh("kubectl", "apply", "-f", "-", input=json.dumps(realnode.pinned_namespace(RELEASE_NS)), env=env, quiet=True)
        sh("kubectl", "apply", "--server-side", "-f", "-",
           input=json.dumps(registry.Registry(cluster.root).namespace_pulls(RELEASE_NS)), env=env, quiet=True)
    sh(str(BIN / "helm"), "install", "disttrain", str(REPO / "charts" / "disttrain-operator"), "--namespace",
       RELEASE_NS, "--create-namespace", *pulls, *(["--wait", "--timeout", "180s"] if in_cluster else []),
       env=env, quiet=True)
    if in_cluster:
        sh("kubectl", "get", "pods", "-n", RELEASE_NS, "-o", "wide", env=env)
        return None
    print("==> running the operator with the chart's ServiceAccount (impersonated: no containers on KWOK)")
    impersonated = impersonating_kubeconfig(cluster.kubeconfig, root / "operator.kubeconfig",
                                            f"system:serviceaccount:{RELEASE_NS}:disttrain-disttrain-operator")
    with open(root / "operator.log", "wb") as log:
        return subprocess.Popen([sys.executable, "-m", "disttrain", "run"], stdout=log, stderr=subprocess.STDOUT,
                                env={**env, "KUBECONFIG": str(impersonated)})


def apply_example(core: Any, env: dict[str, str], workdir: Path, root: Path, pinned: bool) -> None:
    """`kubectl apply -f` the example in its namespace (pinned to the real node, if there is one),
    with a hostPath volume on the node for its checkpoint claim. On the real node its images are
    the plane's registry's, pulled with the namespace's pull secret."""
    namespace = realnode.pinned_namespace(NAMESPACE) if pinned else {"apiVersion": "v1", "kind": "Namespace",
                                                                      "metadata": {"name": NAMESPACE}}
    sh("kubectl", "apply", "-f", "-", input=json.dumps(namespace), env=env, quiet=True)
    docs = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d]
    for claim in (d for d in docs if d["kind"] == "PersistentVolumeClaim"):
        core.create_persistent_volume(realnode.claim_volume(NAMESPACE, claim["metadata"]["name"],
                                                            workdir / "volumes" / claim["metadata"]["name"]))
    if not pinned:
        print(f"==> kubectl apply -n {NAMESPACE} -f {EXAMPLE.relative_to(REPO)}")
        sh("kubectl", "apply", "-n", NAMESPACE, "-f", str(EXAMPLE), env=env)
        return
    sh("kubectl", "apply", "--server-side", "-f", "-",
       input=json.dumps(registry.Registry(root).namespace_pulls(NAMESPACE)), env=env, quiet=True)
    print(f"==> kubectl apply -n {NAMESPACE} -f {EXAMPLE.relative_to(REPO)}  (images from {registry.ADDRESS})")
    sh("kubectl", "apply", "-n", NAMESPACE, "-f", "-",
       input=yaml.safe_dump_all([registry.from_local_registry(d) for d in docs]), env=env)


def wait_for_end(kubelet: KubeletStandIn | None, env: dict[str, str], deadline: float) -> str:
    """Run the stand-in (KWOK) and show the job until it finishes; its last phase."""
    phase = ""
    wanted = int(next(d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d["kind"] == "DistTrainJob")
                 ["spec"]["tensorflow"]["worker"]["replicas"])
    while phase not in ("Succeeded", "Failed") and time.monotonic() < deadline:
        if kubelet is not None:
            kubelet.step(wanted)
        print(sh("kubectl", "get", "disttrainjobs", "-n", NAMESPACE, env=env, quiet=True).rstrip())
        job = json.loads(sh("kubectl", "get", "dtj", JOB_NAME, "-n", NAMESPACE, "-o", "json", env=env, quiet=True))
        phase = (job.get("status") or {}).get("phase", "")
        time.sleep(2)
    return phase


if __name__ == "__main__":
    sys.exit(main())
