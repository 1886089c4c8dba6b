"""Whether a CustomResourceDefinition's resource is served: the one wait the tests, `make bench`
and the gang schedulers' CRDs use (issue 31 asked for one instead of three).

Established is not served: until the API server's watch cache for the new resource has listed it,
lists and watches answer 429 'storage is (re)initializing' (CI saw kopf log that as an ERROR on
its first list). A list at resourceVersion=0 without a limit is answered from that cache only
(with a limit it would go to etcd: apiserver's cacher/delegator.go), so its success says a
controller's first list and watch will be served too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

Get = Callable[[str], Any]  # a GET of an API path: the decoded answer; raises on an error answer


def established(get: Get, name: str) -> bool:
    crd = get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}") or {}
    conditions = (crd.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)


def served(get: Get, crd: Mapping[str, Any]) -> bool:
    """Established, and its storage version's watch cache has listed (see above)."""
    spec = crd["spec"]
    version = next(v["name"] for v in spec["versions"] if v.get("storage"))
    try:
        if not established(get, crd["metadata"]["name"]):
            return False
        get(f"/apis/{spec['group']}/{version}/{spec['names']['plural']}?resourceVersion=0")
    except Exception:  # 404 before it is registered, 429 while its cache lists: not yet
        return False
    return True
