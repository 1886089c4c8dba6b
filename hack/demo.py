"""`make demo`: a job from `kubectl apply` to Succeeded, with real training.

Starts the local control plane, installs the Helm chart, runs the operator as the chart's
ServiceAccount, applies examples/multi-worker-mirrored/job.yaml and shows `kubectl get
disttrainjobs` until the job finishes. KWOK's nodes run no containers, so this script stands
in for the kubelet: it runs each pod's command with real TensorFlow (TF_CONFIG exactly as the
operator wrote it, host names mapped to loopback ports) and reports the real exit code back.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "hack"))
from localcluster import EXIT_CODE_ANNOTATION, LocalCluster, tf_configs_on_loopback  # noqa: E402

BIN = REPO / ".cache" / "bin"
TF_PYTHON = REPO / ".cache" / "tf-venv" / "bin" / "python"
EXAMPLE = REPO / "examples" / "multi-worker-mirrored" / "job.yaml"
RELEASE_NS = "disttrain-system"


def sh(*args: str, env: dict[str, str], input: str | None = None, quiet: bool = False) -> str:
    result = subprocess.run(args, env=env, input=input, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed:\n{result.stderr}")
    if not quiet and result.stdout.strip():
        print(result.stdout.rstrip())
    return result.stdout


def run_pod_containers(pods: list[dict[str, Any]], workdir: Path) -> dict[str, subprocess.Popen[bytes]]:
    """Start each pod's first container locally: its command, its env, TF_CONFIG on loopback."""
    configs = tf_configs_on_loopback({
        p["metadata"]["name"]: json.loads(next(e["value"] for e in p["spec"]["containers"][0]["env"]
                                               if e["name"] == "TF_CONFIG")) for p in pods})
    procs = {}
    for pod in pods:
        name, container = pod["metadata"]["name"], pod["spec"]["containers"][0]
        env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
        env.update(TF_CONFIG=json.dumps(configs[name]), CHECKPOINT_DIR=str(workdir / "checkpoints"),
                   TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="", PATH=os.environ["PATH"])
        # The image's paths, mapped onto this checkout.
        command = [str(TF_PYTHON) if c == "python" else c.replace("/opt/disttrain/", f"{REPO}/")
                   for c in container["command"]]
        log = open(workdir / f"{name}.log", "wb")  # noqa: SIM115 - the child writes to it
        procs[name] = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    return procs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keep", action="store_true", help="leave the cluster running afterwards")
    args = parser.parse_args()
    root = REPO / ".cache" / "demo"
    cluster = LocalCluster(root=root, nodes=2)
    print("==> starting the local control plane (etcd, kube-apiserver, controller-manager, scheduler, KWOK)")
    started = time.monotonic()
    cluster.up()
    print(f"    up in {time.monotonic() - started:.1f}s; export KUBECONFIG={cluster.kubeconfig}")
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig), "PATH": f"{BIN}:{os.environ['PATH']}"}
    operator: subprocess.Popen[bytes] | None = None
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        print(f"==> helm install disttrain charts/disttrain-operator -n {RELEASE_NS}")
        sh(str(BIN / "helm"), "install", "disttrain", str(REPO / "charts" / "disttrain-operator"),
           "--namespace", RELEASE_NS, "--create-namespace", env=env, quiet=True)
        sh("kubectl", "get", "crd", "disttrainjobs.disttrain.dev", env=env)
        print("==> running the operator with the chart's ServiceAccount (impersonated: no image registry here)")
        config = yaml.safe_load(cluster.kubeconfig.read_text())
        config["users"][0]["user"]["as"] = f"system:serviceaccount:{RELEASE_NS}:disttrain-disttrain-operator"
        impersonated = root / "operator.kubeconfig"
        impersonated.write_text(yaml.safe_dump(config))
        log = open(root / "operator.log", "wb")  # noqa: SIM115 - the child writes to it
        operator = subprocess.Popen([sys.executable, "-m", "disttrain", "run"], stdout=log, stderr=subprocess.STDOUT,
                                    env={**env, "KUBECONFIG": str(impersonated)})
        time.sleep(3)
        print(f"==> kubectl apply -f {EXAMPLE.relative_to(REPO)}")
        sh("kubectl", "apply", "-f", str(EXAMPLE), env=env)

        workdir = root / "pods"
        shutil.rmtree(workdir, ignore_errors=True)
        workdir.mkdir(parents=True)
        deadline = time.monotonic() + 600
        phase = ""
        while phase not in ("Succeeded", "Failed") and time.monotonic() < deadline:
            pods = json.loads(sh("kubectl", "get", "pods", "-l", "disttrain.dev/job-name=mnist-mwms", "-o", "json",
                                 env=env, quiet=True))["items"]
            if not procs and len(pods) == 2 and all(p["status"].get("phase") == "Running" for p in pods):
                print("==> pods Running on KWOK nodes; starting their containers with real TensorFlow")
                procs = run_pod_containers(pods, workdir)
            names = {p["metadata"]["name"] for p in pods if not p["metadata"].get("deletionTimestamp")}
            for name, proc in list(procs.items()):
                if name not in names:
                    # The job finished and the operator deleted this pod (cleanPodPolicy: Running):
                    # the kubelet would now stop its container.
                    proc.terminate()
                    print(f"    {name}: pod deleted by the operator after the job finished; container stopped")
                    del procs[name]
                elif proc.poll() is not None:
                    sh("kubectl", "annotate", "pod", name, f"{EXIT_CODE_ANNOTATION}={proc.returncode}",
                       "--overwrite", env=env, quiet=True)
                    print(f"    {name}: training process exited with {proc.returncode}; "
                          f"{(workdir / f'{name}.log').read_text().strip().splitlines()[-1]}")
                    del procs[name]
            print(sh("kubectl", "get", "disttrainjobs", env=env, quiet=True).rstrip())
            phase = json.loads(sh("kubectl", "get", "dtj", "mnist-mwms", "-o", "json", env=env,
                                  quiet=True)).get("status", {}).get("phase", "")
            time.sleep(2)
        print("==> kubectl get disttrainjobs -o wide; kubectl describe (events)")
        sh("kubectl", "get", "disttrainjobs", "-o", "wide", env=env)
        events = sh("kubectl", "get", "events", "--field-selector", "involvedObject.kind=DistTrainJob",
                    "--sort-by=.lastTimestamp", "-o", "custom-columns=TYPE:.type,REASON:.reason,MESSAGE:.message",
                    env=env, quiet=True)
        print(events.rstrip())
        return 0 if phase == "Succeeded" else 1
    finally:
        for proc in procs.values():
            proc.kill()
        if operator is not None:
            operator.terminate()
            operator.wait(timeout=10)
        if args.keep:
            print(f"cluster left running: export KUBECONFIG={cluster.kubeconfig}; stop it with "
                  f"`python hack/localcluster.py down --dir {root}`")
        else:
            cluster.down()


if __name__ == "__main__":
    sys.exit(main())
