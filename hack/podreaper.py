"""The fake nodes' half of a pod delete: what a kubelet does once a pod on its node is being deleted.

A pod bound to a node stays in the API server, terminating, until its node confirms it is gone.
KWOK v0.8.0 confirms with a delete *by name* (pkg/kwok/controllers/pod_controller.go,
deleteResource: no UID precondition) from a queue of stage jobs, one per event of the terminating
pod. A late job deletes whatever pod has that name by then: the replacement the operator has
just created. The chaos suite measured it (tests/chaos/test_operator_kills.py): a job's worker
created 4 times for 2 attempts, and a restart counted for a pod nobody but KWOK deleted. The
kubelet stopped doing this in 2016 (kubernetes/kubernetes#25224: its status manager deletes with
the pod's UID as a precondition), so a test that saw it would be testing the fake, not the operator.

This process takes that stage over for the fake nodes: it watches pods and deletes each pod being
deleted on a fake node with grace period 0 and the UID precondition, after dropping its
finalizers (as KWOK's stage did). Standard library only: it runs beside the cluster, from
LocalCluster, with whatever Python started it.

    python hack/podreaper.py --server URL --pki DIR [--kubelet-node real-node-0]

Every node but those a real kubelet runs (`--kubelet-node`) is a fake one: the cluster's own and
those tests add (any name, the KWOK annotation), and one deleted already (its pods are orphans).
"""

from __future__ import annotations

import argparse
import json
import ssl
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

DELETE_OPTIONS = {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0}


class Reaper:
    def __init__(self, server: str, context: ssl.SSLContext, kubelet_nodes: set[str]) -> None:
        self.server, self.context, self.kubelet_nodes = server, context, kubelet_nodes
        self.done: set[str] = set()  # uids already confirmed gone (a pod's later events repeat it)
        # Deletes in parallel, as KWOK's stage workers made them: a thousand pods deleted at once
        # (make bench) must not wait in one line. Two deletes of one pod are harmless (404, 409).
        self.pool = ThreadPoolExecutor(8)

    def request(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.server + path, data=data, method=method,
                                     headers={"Content-Type": content_type})
        with urllib.request.urlopen(req, context=self.context, timeout=30) as resp:
            return json.loads(resp.read() or b"null")

    def handle(self, pod: dict[str, Any]) -> None:
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        uid = meta.get("uid", "")
        node = spec.get("nodeName")
        if not meta.get("deletionTimestamp") or uid in self.done or not node or node in self.kubelet_nodes:
            return
        path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
        try:
            if meta.get("finalizers"):
                # The uid in a patch must match the pod's (422 otherwise): never another pod's finalizers.
                self.request("PATCH", path, {"metadata": {"uid": uid, "finalizers": None}},
                             "application/merge-patch+json")
            self.request("DELETE", path, {**DELETE_OPTIONS, "preconditions": {"uid": uid}})
        except urllib.error.HTTPError as err:
            with err:
                # 404: gone already; 409: a new pod holds the name (the precondition kept it); 422:
                # the patch named another pod's uid. All three: nothing of this pod left to do.
                if err.code not in (404, 409, 422):
                    print(f"reaping {meta['namespace']}/{meta['name']}: {err.code} {err.read()[:300]!r}",
                          file=sys.stderr, flush=True)
                    return
        self.done.add(uid)
        if len(self.done) > 100_000:
            self.done.clear()  # a pod seen again is only deleted again, harmlessly

    def run(self) -> None:
        while True:
            try:
                listed = self.request("GET", "/api/v1/pods?limit=0")
                for pod in listed.get("items") or []:
                    self.handle(pod)
                self.watch(listed["metadata"]["resourceVersion"])
            except (OSError, ValueError, KeyError, urllib.error.URLError) as err:
                print(f"pod watch: {err!r}; listing again", file=sys.stderr, flush=True)
                time.sleep(0.5)

    def watch(self, version: str) -> None:
        """Until the watch ends (timeout, or its version expired): then the caller lists again."""
        while True:
            url = f"{self.server}/api/v1/pods?watch=1&allowWatchBookmarks=true&resourceVersion={version}" \
                  "&timeoutSeconds=300"
            with urllib.request.urlopen(url, context=self.context, timeout=330) as resp:
                for line in resp:
                    event = json.loads(line)
                    obj = event.get("object") or {}
                    if event.get("type") == "ERROR":
                        return  # 410 Gone: list afresh
                    version = (obj.get("metadata") or {}).get("resourceVersion", version)
                    if event.get("type") in ("ADDED", "MODIFIED") and (obj.get("metadata") or {}).get(
                            "deletionTimestamp"):
                        self.pool.submit(self.handle, obj)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", required=True)
    parser.add_argument("--pki", required=True, help="a folder with ca.crt, admin.crt and admin.key")
    parser.add_argument("--kubelet-node", action="append", default=[], help="a node a real kubelet runs: not ours")
    args = parser.parse_args()
    context = ssl.create_default_context(cafile=f"{args.pki}/ca.crt")
    context.load_cert_chain(f"{args.pki}/admin.crt", f"{args.pki}/admin.key")
    Reaper(args.server, context, set(args.kubelet_node)).run()


if __name__ == "__main__":
    main()
