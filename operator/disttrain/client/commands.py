"""`disttrain logs` (also `kubectl disttrain logs`, the same program installed as a kubectl plugin)."""

from __future__ import annotations

import os
import sys

from disttrain.client.joblogs import JobNotFound
from disttrain.client.training import Client


def logs_command(job: str, *, namespace: str | None, follow: bool, replica_type: str | None, previous: bool,
                 kubeconfig: str | None = None, context: str | None = None) -> int:
    try:
        with Client(namespace, kubeconfig=kubeconfig, context=context) as dt:
            for line in dt.logs(job, follow=follow, replica_type=replica_type, previous=previous):
                # A log that can't be read is said on stderr: stdout stays the job's own lines.
                print(line, file=sys.stderr if line.error else sys.stdout, flush=follow)
    except JobNotFound as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `disttrain logs job | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
