"""`disttrain logs` and `disttrain progress` (also `kubectl disttrain ...`, the same program installed
as a kubectl plugin)."""

from __future__ import annotations

import datetime
import os
import sys
import time
from collections.abc import Callable

import urllib3
from kubernetes import client

from disttrain.client.connection import ConnectError, api_message, unreachable
from disttrain.client.curves import draw
from disttrain.client.joblogs import JobNotFound
from disttrain.client.training import Client, JobError
from disttrain.client.usage import usage_lines


def _said_in_one_line(command: Callable[[], int]) -> int:
    """A problem reaching the cluster or the job, as one line (kubectl's `error: ...`)."""
    try:
        return command()
    except (JobNotFound, JobError, ConnectError) as err:
        message = str(err)
    except client.ApiException as err:  # a 403, say: the API server's own words
        message = api_message(err)
    except urllib3.exceptions.HTTPError as err:
        message = unreachable(err)
    except KeyboardInterrupt:
        return 130
    print(f"error: {message}", file=sys.stderr)
    return 1


def logs_command(job: str, *, namespace: str | None, follow: bool, replica_type: str | None, previous: bool,
                 kubeconfig: str | None = None, context: str | None = None) -> int:
    def command() -> int:
        try:
            with Client(namespace, kubeconfig=kubeconfig, context=context) as dt:
                for line in dt.logs(job, follow=follow, replica_type=replica_type, previous=previous):
                    # A log that can't be read is said on stderr: stdout stays the job's own lines.
                    print(line, file=sys.stderr if line.error else sys.stdout, flush=follow)
        except BrokenPipeError:  # `disttrain logs job | head`: the reader has what it wanted
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return _said_in_one_line(command)


def progress_command(job: str, *, namespace: str | None, follow: bool, interval: float = 2.0,
                     kubeconfig: str | None = None, context: str | None = None) -> int:
    """The job's progress and curves (client/curves.py); with `follow`, redrawn as its status
    changes until it succeeds or fails (in place on a terminal, a new block per change elsewhere)."""
    in_place = sys.stdout.isatty()
    shown: list[str] = []

    def command() -> int:
        nonlocal shown
        with Client(namespace, kubeconfig=kubeconfig, context=context) as dt:
            while True:
                found = dt.get(job)
                now = datetime.datetime.now(datetime.UTC)
                lines = draw(found, now) + usage_lines(found.get("status") or {}, now)
                if lines != shown:
                    if in_place and shown:
                        sys.stdout.write(f"\x1b[{len(shown)}F\x1b[J")  # up over the last drawing, cleared
                    print("\n".join(lines), flush=True)
                    shown = lines
                if not follow or (found.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                    return 0
                time.sleep(interval)
    return _said_in_one_line(command)
