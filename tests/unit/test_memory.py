"""The burst's memory is given back once the operator is quiet (runtime/memory.py)."""

from __future__ import annotations

import asyncio

import pytest

from disttrain.runtime import memory


def test_trims_once_after_work_then_quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    trims: list[int] = []

    def trim() -> int:
        trims.append(1)
        return 1
    monkeypatch.setattr(memory, "_trimmer", lambda: trim)
    done = [0]

    async def scenario() -> None:
        task = asyncio.create_task(memory.trim_when_quiet(lambda: done[0], quiet=0.02))
        await asyncio.sleep(0.1)
        assert trims == [], "no work yet: nothing to give back"
        done[0] = 200  # a burst
        await asyncio.sleep(0.1)
        assert trims == [1], "quiet after work: one trim"
        await asyncio.sleep(0.1)
        assert trims == [1], "still quiet: not again"
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(scenario())


def test_glibcs_malloc_trim_gives_freed_heap_back() -> None:
    """What trimming is for (issue 31: this test asserted only that malloc_trim returns 0 or 1):
    after a burst's objects are freed, glibc keeps their pages and RSS stays at the high-water
    mark; a trim gives them back. 100,000 objects of 1.5 KB (past pymalloc's 512 bytes: glibc's
    heap), every thousandth kept so the heap can't shrink from its top alone."""
    import gc

    def rss_mib() -> float:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:")) / 1024

    trim = memory._trimmer()
    assert trim is not None
    trim()
    before = rss_mib()
    burst = [bytes(1500) + str(i).encode() for i in range(100_000)]
    kept = burst[::1000]
    del burst
    gc.collect()
    freed = rss_mib()
    assert freed - before > 100, "glibc kept the freed burst's pages (what the trim is for)"
    trim()
    assert rss_mib() - before < 20, f"trimmed back near {before:.0f} MiB from {freed:.0f}"
    assert len(kept) == 100


def test_the_resyncs_pod_list_is_paged_and_decoded_for_uids_alone() -> None:
    """A namespace's pods are listed for the tombstone resync a page at a time (a continue token per
    page), so a 20,000-pod namespace is never one answer decoded whole (make bench, issue 25)."""
    import json
    from collections.abc import Mapping
    from typing import Any

    from disttrain.apiserver.kube import UID_PAGE, Kube

    fields: dict[str, Any] = {"f:metadata": {"f:labels": {f"f:label-{i}": {} for i in range(20)}}}
    pages = [([f"uid-{p}-{i}" for i in range(3)], f"token-{p}" if p < 2 else "") for p in range(3)]
    asked: list[dict[str, str]] = []

    class PagedRest:
        async def request(self, method: str, url_path: str, *, params: Mapping[str, str], accept: str,
                          raw: bool = False, **_: Any) -> bytes:
            assert (method, url_path, raw) == ("GET", "/api/v1/namespaces/ml/pods", True)
            assert "as=PartialObjectMetadataList" in accept
            asked.append(dict(params))
            uids, token = pages[len(asked) - 1]
            return json.dumps({"kind": "PartialObjectMetadataList", "metadata": {"continue": token},
                               "items": [{"metadata": {"name": u, "uid": u, "managedFields": [
                                   {"manager": "disttrain", "fieldsV1": fields}]}} for u in uids]}).encode()

    uids = asyncio.run(Kube(PagedRest()).pod_uids("ml"))  # type: ignore[arg-type]
    assert uids == {u for page, _ in pages for u in page}
    assert [a.get("continue") for a in asked] == [None, "token-0", "token-1"]
    assert {a["limit"] for a in asked} == {str(UID_PAGE)}
    assert {a["labelSelector"] for a in asked} == {"disttrain.dev/job-name"}
