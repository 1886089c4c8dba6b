"""What `disttrain render` reads: the jobs of a file (a `kind: List`, as `kubectl get -o yaml` prints,
item by item), refused as the API server would refuse them (api/admission.py), or one line saying
why the file holds none. The lines name no file: the command prefixes them."""

from __future__ import annotations

from typing import Any

import yaml

from disttrain.api.constants import API_VERSION, KIND


class RenderRefused(Exception):
    """The file can't be rendered: one line each (a YAML error, no job, what the CRD refuses)."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__("\n".join(lines))
        self.lines = lines


class _JSONTypesLoader(yaml.SafeLoader):
    """YAML as `kubectl` reads it: an unquoted date stays a string (PyYAML's timestamp type would be
    refused by the schema check as no string: `value: 2020-01-01` is accepted by `kubectl apply`)."""


_JSONTypesLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}


def documents(text: str) -> list[Any]:
    """The file's documents, a List's items in its place."""
    try:
        loaded = list(yaml.load_all(text, Loader=_JSONTypesLoader))
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise RenderRefused([f"not YAML: {where}{problem}"]) from err
    out: list[Any] = []
    for doc in loaded:
        listed = isinstance(doc, dict) and str(doc.get("kind", "")).endswith("List") and \
            isinstance(doc.get("items"), list)
        out.extend(doc["items"] if listed else [doc])
    return out


def _none_found(docs: list[Any]) -> str:
    kinds = [f"kind {d.get('kind')} ({d.get('apiVersion')})" for d in docs if isinstance(d, dict) and "kind" in d]
    if kinds:
        return f"no {KIND} here, only {', '.join(kinds)}: a job is apiVersion: {API_VERSION}, kind: {KIND}"
    if any(isinstance(d, list) for d in docs):
        return f"a YAML list, not a {KIND}: a job is a mapping with apiVersion: {API_VERSION}, kind: {KIND}"
    if any(d is not None for d in docs):
        return f"no {KIND} here: a job is a mapping with apiVersion: {API_VERSION}, kind: {KIND}"
    return f"empty: no {KIND} to render"


def name_of(job: dict[str, Any]) -> str:
    meta = job.get("metadata")
    return str(meta.get("name") or "") if isinstance(meta, dict) else ""


def jobs(docs: list[Any]) -> list[dict[str, Any]]:
    """The file's DistTrainJobs; RenderRefused if there are none or the API server would refuse one."""
    found = [d for d in docs if isinstance(d, dict) and d.get("kind") == KIND]
    if not found:
        raise RenderRefused([_none_found(docs)])
    # The CRD serves one version: `kubectl apply` finds no other ("no matches for kind").
    versions = [f'{KIND} "{name_of(job)}": apiVersion {job.get("apiVersion")!r}: the CRD serves {API_VERSION}'
                for job in found if job.get("apiVersion") != API_VERSION]
    if versions:
        raise RenderRefused(versions)
    try:
        from disttrain.api.admission import refusals
    except ImportError:  # an install without jsonschema or cel-python: `disttrain render` says it didn't check
        return found
    refused = [f'{KIND} "{name_of(job)}": {line}' for job in found for line in refusals(job)]
    if refused:
        raise RenderRefused(refused)
    return found
