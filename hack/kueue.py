"""Kueue on the local plane: its controller built from the Go module proxy (hack/build-binaries.sh),
run as a process with an admin kubeconfig, its CRDs from its own module.

Out of a cluster Kueue needs (facts of v0.19.2's cmd/kueue):
- internal certificate management off (it would wait for a Secret volume that never comes);
- a serving cert for its webhook server, signed by the cluster's CA; its published webhook
  configurations for Kueue's own kinds (Workload, ClusterQueue, ResourceFlavor, ...) are registered
  with the Service reference swapped for the process's URL, so the API server calls Kueue to default
  and validate every Workload the operator writes, as in a real install (its job/pod webhooks are
  left out: those integrations are not enabled here);
- certs at the hard-coded /etc/kueue/metrics/certs even with metrics off: Kueue runs in a mount
  namespace of its own with an overlay on /etc that holds them, so the host's /etc is untouched;
- leader election off, and the on-demand visibility server off (it exits the process without its
  own certs).
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import yaml
from cryptography.x509.oid import ExtendedKeyUsageOID

import pki
from fakedra import FAKE_GPU_CLASS, FAKE_GPU_RESOURCE
from gangschedulers import Plane, install_crds
from ports import free_port, http_ok

NAMESPACE = "kueue-system"
WAIT_FOR_PODS_READY_SECONDS = 30
WORKER_LOST_SECONDS = 20
MULTIKUEUE_ORIGIN = "disttrain-local"  # labels what this plane's MultiKueue made on its workers


def available(bin_dir: Path) -> bool:
    return (bin_dir / "kueue").exists() and (bin_dir / "crds" / "kueue").is_dir()


def start(plane: Plane, bin_dir: Path, deadline: float) -> None:
    install_crds(plane, [bin_dir / "crds" / "kueue"], deadline)
    plane.api("POST", "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
    home = plane.root / "kueue"
    certs, upper, work = home / "webhook-certs", home / "etc-upper", home / "etc-work"
    metrics_certs = upper / "kueue" / "metrics" / "certs"
    for folder in (certs, metrics_certs, work):
        folder.mkdir(parents=True, exist_ok=True)
    serving = plane.root / "pki"
    pki.issue(serving, "kueue", pki.subject("kueue"), ips=["127.0.0.1"], dns=["localhost"],
              usage=[ExtendedKeyUsageOID.SERVER_AUTH])
    for folder in (certs, metrics_certs):
        (folder / "tls.crt").write_bytes((serving / "kueue.crt").read_bytes())
        (folder / "tls.key").write_bytes((serving / "kueue.key").read_bytes())
    health, webhook_port = free_port(), free_port()
    config = home / "config.yaml"
    config.write_text(json.dumps({
        "apiVersion": "config.kueue.x-k8s.io/v1beta2", "kind": "Configuration",
        "namespace": NAMESPACE, "manageJobsWithoutQueueName": False,
        "internalCertManagement": {"enable": False},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(certs)},
        "metrics": {"bindAddress": "0"},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health}"},
        "leaderElection": {"leaderElect": False},
        "integrations": {"frameworks": ["batch/job"], "externalFrameworks": ["DistTrainJob.v1.disttrain.dev"]},
        # On, as platform teams run it: an admitted Workload whose pods aren't all Ready within the
        # timeout is evicted and requeued by Kueue (tests/integration/test_kueue.py); our pods on
        # KWOK are Ready within seconds, so only a job meant to stall meets it.
        "waitForPodsReady": {"timeout": f"{WAIT_FOR_PODS_READY_SECONDS}s", "blockAdmission": False,
                             "recoveryTimeout": f"{WAIT_FOR_PODS_READY_SECONDS}s"},
        # MultiKueue (beta, on) with its generic adapter for kinds Kueue doesn't know
        # (MultiKueueAdaptersForCustomJobs, beta, on): this plane can be a manager that dispatches
        # DistTrainJobs to worker planes (tests/integration/test_multikueue.py). A worker it loses
        # is given up after WORKER_LOST_SECONDS (Kueue's default: 15 minutes) and the job requeued.
        "multiKueue": {"externalFrameworks": [{"name": "DistTrainJob.v1.disttrain.dev"}],
                       "workerLostTimeout": f"{WORKER_LOST_SECONDS}s", "origin": MULTIKUEUE_ORIGIN},
        "featureGates": {"VisibilityOnDemand": False},
        # DRA quota (KueueDRAIntegration, beta, on): devices of the fake GPU class that KWOK nodes'
        # ResourceSlices publish count as FAKE_GPU_RESOURCE (tests/integration/test_dra_jobs.py).
        "resources": {"deviceClassMappings": [{"name": FAKE_GPU_RESOURCE, "deviceClassNames": [FAKE_GPU_CLASS]}]},
    }))
    overlay = f"lowerdir=/etc,upperdir={upper},workdir={work}"
    plane.spawn("kueue", ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
                          f'mount -t overlay overlay -o {overlay} /etc && exec "$0" "$@"', str(bin_dir / "kueue"),
                          f"--config={config}", f"--kubeconfig={plane.kubeconfig}", "--zap-log-level=2"])
    # readyz includes the webhook server
    plane.wait("Kueue ready", lambda: http_ok(f"http://127.0.0.1:{health}/readyz"), deadline)
    register_webhooks(plane, bin_dir / "kueue-webhooks" / "manifests.yaml", webhook_port,
                      (serving / "ca.crt").read_bytes())


def register_webhooks(plane: Plane, manifests: Path, port: int, ca: bytes) -> None:
    """Kueue's webhook configurations, only the webhooks for its own API group, pointed at the
    process on 127.0.0.1:<port> instead of the in-cluster Service."""
    bundle = base64.b64encode(ca).decode()
    for doc in yaml.safe_load_all(manifests.read_text()):
        if not doc or not doc.get("kind", "").endswith("WebhookConfiguration"):
            continue
        hooks = [h for h in doc["webhooks"]
                 if all(r["apiGroups"] == ["kueue.x-k8s.io"] for r in h["rules"])]
        for hook in hooks:
            hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{hook['clientConfig']['service']['path']}",
                                    "caBundle": bundle}
        plural = doc["kind"].lower() + "s"
        plane.api("POST", f"/apis/admissionregistration.k8s.io/v1/{plural}",
                  {"apiVersion": doc["apiVersion"], "kind": doc["kind"],
                   "metadata": {"name": f"kueue-{doc['metadata']['name']}"}, "webhooks": hooks})

