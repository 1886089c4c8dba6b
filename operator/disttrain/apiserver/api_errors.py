"""What an API error was, told from the API server's Status body, not from its HTTP code alone.

The code alone misleads both ways (issue 21, defect 4):
- a validating webhook that denies without a code of its own is answered 400 (apiserver's
  webhook errors.ToStatusErr raises anything under 400 to 400), the same code as a pod the
  API can't decode; a denial may pass (the policy changes, the webhook comes back), a pod that
  can't be decoded never will;
- a 403 is a quota exceeded, a PodSecurity level, a missing PriorityClass (admission: may pass)
  or the operator's own ServiceAccount lacking a grant (RBAC: the install must be fixed).

Each kind says what it was in the message the job's status shows, in the API server's words.
"""

from __future__ import annotations

import enum
import json
import re
from dataclasses import dataclass
from typing import Any


class ErrorKind(enum.StrEnum):
    INVALID = "invalid"  # 422, or a 400 that isn't a webhook's: the object will never be accepted
    WEBHOOK = "denied by an admission webhook"
    QUOTA = "refused by a ResourceQuota"
    ADMISSION = "refused by admission"  # PodSecurity, a missing PriorityClass, LimitRange, ...
    NAMESPACE_TERMINATING = "refused: the namespace is being deleted"  # teardown.py waits it out
    RBAC = "forbidden by RBAC"  # the operator's own permissions
    CONFLICT = "conflict"
    NOT_FOUND = "not found"  # 404: gone meanwhile (the job deleted during its pass)
    EXISTS = "already exists"
    THROTTLED = "throttled"  # 429
    SERVER = "server error"  # 5xx, a timeout
    OTHER = "error"


# What a create may meet that someone other than the job can lift: the job waits and tries again.
REFUSALS = frozenset({ErrorKind.WEBHOOK, ErrorKind.QUOTA, ErrorKind.ADMISSION, ErrorKind.RBAC})
# `admission webhook "NAME" denied the request: ...` (k8s.io/apiserver/pkg/admission/plugin/webhook/errors).
_WEBHOOK = re.compile(r'admission webhook "[^"]+" denied the request')
# The authorizer's words: `User "system:serviceaccount:ns:sa" cannot create resource "pods" ...`.
_RBAC = re.compile(r'cannot \w+ resource "')


@dataclass(frozen=True)
class APIError:
    code: int
    kind: ErrorKind
    message: str  # the API server's own (a webhook's denial names the webhook)

    def describe(self) -> str:
        """For the job's status: which kind of refusal, then the API server's words."""
        return f"{self.kind.value} ({self.code}): {self.message}"


def classify(code: int, body: Any, reason: str = "") -> APIError:
    try:
        status = json.loads(body or b"{}")
    except (TypeError, ValueError):
        status = {}
    if not isinstance(status, dict):
        status = {}
    message = str(status.get("message") or reason or f"HTTP {code}")
    status_reason = str(status.get("reason") or "")
    if _WEBHOOK.search(message):
        return APIError(code, ErrorKind.WEBHOOK, message)
    if code == 403:
        # The namespace lifecycle admission refusing new content in a namespace being deleted:
        # its details carry the cause NamespaceTerminating (k8s.io/api/core/v1).
        details = status.get("details")
        causes = details.get("causes") if isinstance(details, dict) else None
        if any(isinstance(c, dict) and c.get("reason") == "NamespaceTerminating" for c in causes or []):
            return APIError(code, ErrorKind.NAMESPACE_TERMINATING, message)
        if _RBAC.search(message):
            return APIError(code, ErrorKind.RBAC, message)
        if "exceeded quota" in message:
            return APIError(code, ErrorKind.QUOTA, message)
        return APIError(code, ErrorKind.ADMISSION, message)
    if code in (400, 422):
        return APIError(code, ErrorKind.INVALID, message)
    if code == 409:
        return APIError(code, ErrorKind.EXISTS if status_reason == "AlreadyExists" else ErrorKind.CONFLICT, message)
    if code == 404:
        return APIError(code, ErrorKind.NOT_FOUND, message)
    if code == 429:
        return APIError(code, ErrorKind.THROTTLED, message)
    if code >= 500 or code == 408:
        return APIError(code, ErrorKind.SERVER, message)
    return APIError(code, ErrorKind.OTHER, message)
