"""What the API server would say to a new DistTrainJob, offline, in `kubectl apply`'s words: the
CRD's structural schema (with `jsonschema`) and its `x-kubernetes-validations` CEL rules (with
`cel-python`), in the API server's order: unknown fields refused (kubectl's strict field
validation), the schema's defaults applied, the schema, then the rules.

Rules that read `oldSelf` are transition rules: they judge an update against the stored object and
never run on a create, so they are skipped here. The CRD's rules use only standard CEL (`has`,
`size`, `string`, `matches`, `in`, ternaries): cel-python needs no Kubernetes extension shims.
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Iterator
from typing import Any

import celpy
import jsonschema
from celpy.adapter import json_to_cel
from celpy.evaluation import CELEvalError

from disttrain.api.crd import crd
from disttrain.api.crd_size import CREATE_ONLY

Schema = dict[str, Any]

# A rule's reason (x-kubernetes-validations' `reason`) as the API server words it.
REASONS = {"FieldValueRequired": "Required value", "FieldValueForbidden": "Forbidden",
           "FieldValueDuplicate": "Duplicate value"}


@functools.cache
def job_schema() -> Schema:
    schema: Schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


@functools.cache
def _validator() -> jsonschema.protocols.Validator:
    # OpenAPI v3.0's schema object is JSON Schema draft 4's keywords (boolean exclusiveMinimum, and
    # 1.0 is no integer); the x-kubernetes-* keys are ignored by it and read below.
    return jsonschema.Draft4Validator(job_schema())


def refusals(job: dict[str, Any]) -> list[str]:
    """One line per error, as the API server words it; [] if it would admit the job."""
    schema = job_schema()
    if unknown := [f'unknown field "{path}"' for path in _unknown_fields(job, schema, "")]:
        return unknown  # strict decoding fails before anything is validated
    job = copy.deepcopy(job)
    _apply_defaults(job, schema)
    lines = [_schema_line(err) for err in sorted(_validator().iter_errors(job), key=lambda e: list(e.absolute_path))]
    if not lines and not (job.get("metadata") or {}).get("name"):  # the schema has made metadata an object
        lines.append("metadata.name: Required value: name or generateName is required")
    return lines or [line for value, node, path in _walk(job, schema, "") for line in _rule_lines(value, node, path)]


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def _children(value: Any, schema: Schema, path: str) -> Iterator[tuple[Any, Schema, str]]:
    if isinstance(value, dict):
        properties, extra = schema.get("properties") or {}, schema.get("additionalProperties")
        for key, child in value.items():
            sub = properties.get(key, extra if isinstance(extra, dict) else None)
            if sub is not None:
                yield child, sub, _join(path, key)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, child in enumerate(value):
            yield child, schema["items"], _join(path, i)


def _walk(value: Any, schema: Schema, path: str) -> Iterator[tuple[Any, Schema, str]]:
    yield value, schema, path
    for child in _children(value, schema, path):
        yield from _walk(*child)


def _unknown_fields(value: Any, schema: Schema, path: str) -> Iterator[str]:
    for node, sub, where in _walk(value, schema, path):
        properties = sub.get("properties")
        if isinstance(node, dict) and properties is not None and not sub.get("x-kubernetes-preserve-unknown-fields"):
            yield from (_join(where, key) for key in node if key not in properties)


def _apply_defaults(value: Any, schema: Schema) -> None:
    """As the API server defaults a structural schema's absent fields, before validating."""
    for node, sub, _ in _walk(value, schema, ""):
        if isinstance(node, dict):
            for key, prop in (sub.get("properties") or {}).items():
                if key not in node and "default" in prop:
                    node[key] = copy.deepcopy(prop["default"])


def _shown(value: Any) -> str:
    """A value as the API server's messages show it: objects and arrays by their type."""
    if isinstance(value, dict):
        return '"object"'
    return '"array"' if isinstance(value, list) else json.dumps(value)


def _json_type(value: Any) -> str:
    kinds = ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"), (dict, "object"),
             (list, "array"))
    return next((name for kind, name in kinds if isinstance(value, kind)), "null")


def _schema_line(err: jsonschema.ValidationError) -> str:
    path = ""
    for key in err.absolute_path:
        path = _join(path, key)
    value, bound, body = err.instance, err.validator_value, f"{path} in body"
    if err.validator == "required":
        return f"{_join(path, err.message.split(chr(39))[1])}: Required value"
    if err.validator == "enum":
        return f"{path}: Unsupported value: {_shown(value)}: supported values: {', '.join(map(json.dumps, bound))}"
    said = {
        "type": f'{body} must be of type {bound}: "{_json_type(value)}"',
        "minimum": f"{body} should be greater than or equal to {bound}",
        "maximum": f"{body} should be less than or equal to {bound}",
        "pattern": f"{body} should match '{bound}'",
        "minLength": f"{body} should be at least {bound} chars long",
        "maxLength": f"{body} may not be more than {bound} bytes",
        "minItems": f"{body} should have at least {bound} items",
        "maxItems": f"{body} must have at most {bound} items",
    }.get(str(err.validator), err.message)
    shown = f'"{_json_type(value)}"' if err.validator == "type" else _shown(value)
    return f"{path}: Invalid value: {shown}: {said}"


@functools.cache
def _program(rule: str) -> Any:
    env = celpy.Environment()
    return env.program(env.compile(rule))


def _rule_lines(value: Any, schema: Schema, path: str) -> Iterator[str]:
    for rule in schema.get("x-kubernetes-validations") or ():
        text = rule["rule"]
        if rule.get("optionalOldSelf") and text.startswith(CREATE_ONLY):
            text = text[len(CREATE_ONLY):]  # a creation's rule: what follows decides when there is no oldSelf
        elif "oldSelf" in text:
            continue  # a transition rule: an update's, never a create's
        try:
            held = bool(_program(text).evaluate({"self": json_to_cel(value)}))
        except CELEvalError as err:  # a field a rule reads without has(): the API server says so too
            yield f"{path or '<root>'}: Invalid value: {_shown(value)}: rule {rule['rule']!r}: {err.args[0]}"
            continue
        if held:
            continue
        where = (path + rule["fieldPath"]).lstrip(".") if rule.get("fieldPath") else path
        message = rule.get("message") or f"failed rule: {rule['rule']}"
        reason = REASONS.get(rule.get("reason", ""), f'Invalid value: "{schema.get("type", "object")}"')
        yield f"{where}: {reason}: {message}" if where else f"{reason}: {message}"
