"""The operator's start-up check of the API server's version (the chart renders offline, so the
operator is what says a cluster is too old)."""

from __future__ import annotations

from disttrain.runtime.preflight import server_version, version_note, version_problem


def test_reads_plain_and_managed_cluster_versions() -> None:
    assert server_version({"major": "1", "minor": "36", "gitVersion": "v1.36.3"}) == (1, 36)
    assert server_version({"major": "1", "minor": "29+", "gitVersion": "v1.29.8-gke.1"}) == (1, 29)
    assert server_version({"major": "", "minor": "", "gitVersion": "v1.31.0"}) == (1, 31)
    assert server_version({"gitVersion": "something"}) is None


def test_too_old_a_cluster_is_named_with_both_versions() -> None:
    problem = version_problem({"major": "1", "minor": "29", "gitVersion": "v1.29.4"})
    assert problem is not None and "1.30 or later" in problem and "v1.29.4" in problem


def test_supported_and_unreadable_versions_pass() -> None:
    assert version_problem({"major": "1", "minor": "30", "gitVersion": "v1.30.0"}) is None
    assert version_problem({"major": "2", "minor": "0", "gitVersion": "v2.0.0"}) is None
    assert version_problem({}) is None


def test_a_supported_version_outside_the_tested_ones_is_noted_not_refused() -> None:
    assert version_note({"major": "1", "minor": "36", "gitVersion": "v1.36.3"}) is None
    assert version_note({"major": "1", "minor": "37", "gitVersion": "v1.37.2"}) is None
    older = version_note({"major": "1", "minor": "32", "gitVersion": "v1.32.9"})
    assert older is not None and "v1.32.9" in older and "tested on 1.36, 1.37" in older and "gang" in older
    newer = version_note({"major": "1", "minor": "38", "gitVersion": "v1.38.0"})
    assert newer is not None and "v1.38.0" in newer and "gang" not in newer
    assert version_problem({"major": "1", "minor": "38", "gitVersion": "v1.38.0"}) is None


def test_an_older_crds_status_schema_is_named_by_the_fields_it_lacks() -> None:
    """The review of issue 31: `helm upgrade` never updates the chart's CRDs, and under the previous
    schema the API server pruned status.sshSecret and status.elastic.leaving from every write: a
    job's next pass took it for one an earlier operator started. The operator waits for the CRD,
    naming what it lacks."""
    import copy

    from disttrain.api.crd import status_schema
    from disttrain.runtime.preflight import missing_fields

    ours = status_schema()
    assert missing_fields(ours, copy.deepcopy(ours), "status") == []
    before = copy.deepcopy(ours)
    del before["properties"]["sshSecret"]
    del before["properties"]["elastic"]["properties"]["leaving"]
    assert missing_fields(ours, before, "status") == ["status.elastic.leaving", "status.sshSecret"]
    assert missing_fields(ours, {"type": "object", "x-kubernetes-preserve-unknown-fields": True}, "status") == []


def test_the_previous_releases_crd_is_told_apart_by_what_it_lacks() -> None:
    """The CRD of the release the upgrade test starts from (hack/releases.py): the spec and status fields
    it lacks are named (0.2.0 added runPolicy.injectProgressHook; the stall rule runPolicy.stallTimeoutSeconds,
    runPolicy.onStall and status.progress.advanced; goodput's status.usage), as one it had would be
    (spec.mpi.bootstrap)."""
    import copy

    import yaml

    import releases
    from disttrain.api.crd import job_schema
    from disttrain.runtime.preflight import missing_fields

    previous = yaml.safe_load((releases.source() / "crds" / "disttrainjobs.disttrain.dev.yaml").read_text())
    schema = previous["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    ours = job_schema()
    added = ["spec.runPolicy.injectProgressHook", "spec.runPolicy.stallTimeoutSeconds", "spec.runPolicy.onStall"]
    assert missing_fields(ours["properties"]["spec"], schema["properties"]["spec"], "spec") == added
    assert missing_fields(ours["properties"]["status"], schema["properties"]["status"], "status") == [
        "status.progress.advanced", "status.usage"]
    before = copy.deepcopy(schema["properties"]["spec"])
    del before["properties"]["mpi"]["properties"]["bootstrap"]
    assert missing_fields(ours["properties"]["spec"], before, "spec") == ["spec.mpi.bootstrap", *added]
