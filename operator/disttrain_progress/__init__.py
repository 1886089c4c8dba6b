"""Report a training's progress to the disttrain operator, from inside a DistTrainJob's pod.

    import disttrain_progress as progress
    progress.report(epoch=3, total_epochs=10, step=1200, total_steps=4000, metrics={"loss": 0.23})
    model.fit(..., callbacks=[progress.keras_callback()])      # Keras: per epoch, and every few seconds
    progress.for_rank(hvd.rank()).report(...)                  # Horovod: rank 0 reports, the others don't

`kubectl get dtj` then shows PROGRESS% and ETA, `disttrain progress JOB` draws the curves.

Before the operator stops the job for a reason that isn't a failure (a Kueue preemption, a suspend)
it asks for a checkpoint and waits `runPolicy.checkpointGraceSeconds` for the confirmation:

    if (request := progress.checkpoint_requested()) is not None:   # every rank sees it
        save()                                                       # your strategy's own save
        progress.confirm_checkpoint(request, step=step, path=where)  # the reporting rank tells

The request is a file every pod of the job has (DISTTRAIN_CHECKPOINT_DIR/request), rewritten by
the kubelet within a second of the operator's ask; checking it is one small read.

Standard library only. It never fails or slows the training: `report()` only swaps in the latest
report (one is held; an older one not yet sent is dropped), a daemon thread sends it, and when the
operator can't be reached the thread backs off (to a minute) while training goes on; a flush at
the end of training tries once more at once, and a name the resolver fails on is reached at the
address it had last. Outside a
reporting pod (no progress volume: an operator without a progress endpoint, a pod that doesn't
report for its job, your laptop) every call does nothing.

The operator gives a reporting pod a volume (DISTTRAIN_PROGRESS_DIR, else DEFAULT_DIR) holding
`url`, `ca.crt`, `role` and `token`, a service-account token bound to the pod, which the kubelet
renews: it is read afresh for each report. Files, not variables, so MPI ranks that sshd starts
find them too.
"""

from __future__ import annotations

import atexit
import functools
import http.client
import json
import math
import os
import re
import socket
import ssl
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

_Method = TypeVar("_Method", bound=Callable[..., None])

__all__ = ["CHECKPOINT_DIR", "DEFAULT_DIR", "Reporter", "checkpoint_requested", "confirm_checkpoint", "flush",
           "for_rank", "keras_callback", "mpi_rank", "report", "reporter"]

DEFAULT_DIR = "/var/run/secrets/disttrain.dev/progress"
CHECKPOINT_DIR = "/var/run/disttrain.dev/checkpoint"
MAX_METRICS = 16
_NAME = re.compile(r"[^A-Za-z0-9_]")
BACKOFF = (1.0, 60.0)  # seconds after a failed send: first, at most
QUICK_LOOKUPS = 30  # a name the resolver can't answer for now: tries at the first backoff, then growing


def _clean_metrics(metrics: Any) -> dict[str, float]:
    """Names the operator takes (letters, digits, _), finite numbers only, at most 16. Anything but
    a mapping is no metrics: a ParameterServerStrategy coordinator's batch logs are a RemoteValue,
    which only a wait for the step could read (its epoch logs are numbers)."""
    out: dict[str, float] = {}
    if not isinstance(metrics, Mapping):
        return out
    for name, value in metrics.items():
        try:
            number = float(value)
        except Exception:  # a tensor's own errors too: a metric is left out, never raised
            continue
        key = _NAME.sub("_", str(name))[:64]
        if key and key[0].isdigit():
            key = "_" + key[:63]
        if key and math.isfinite(number) and len(out) < MAX_METRICS:
            out[key] = number
    return out


class Reporter:
    """Sends the latest report from a daemon thread. `role` is what this pod reports for its job:
    training or evaluation (read from the volume; None: this process doesn't report)."""

    def __init__(self, directory: str | None = None, min_interval: float = 2.0, timeout: float = 5.0) -> None:
        self.directory = directory or os.environ.get("DISTTRAIN_PROGRESS_DIR") or DEFAULT_DIR
        self.min_interval, self.timeout = min_interval, timeout
        self.url = self._read("url")
        self.role = self._read("role") or None
        self._context: ssl.SSLContext | None = None
        self._pending: dict[str, Any] | None = None
        self._sending = False
        self._lock = threading.Condition()
        self._thread: threading.Thread | None = None
        self._said: set[str] = set()
        self._addresses: dict[tuple[str, int], list[Any]] = {}  # the endpoint's, as last resolved
        self._hurry = False  # a flush: try now, not after the backoff
        self._told = 0.0  # seconds the operator's last answer said to wait (Retry-After)
        self._unresolved = False  # the last send failed on a name never resolved, EAI_AGAIN: retried sooner
        self._last: dict[str, Any] = {}  # the latest report's body, which a confirmation repeats
        self.sent = self.refused = 0

    @property
    def enabled(self) -> bool:
        return bool(self.url and self.role)

    def _read(self, name: str) -> str:
        try:
            with open(os.path.join(self.directory, name), encoding="utf-8") as file:
                return file.read().strip()
        except OSError:
            return ""

    def report(self, epoch: int | None = None, total_epochs: int | None = None, step: int | None = None,
               total_steps: int | None = None, metrics: dict[str, Any] | None = None) -> None:
        """The training's state now (every argument optional; epochs and steps done so far)."""
        if not self.enabled:
            return
        try:
            counts = (("epoch", epoch), ("totalEpochs", total_epochs), ("step", step), ("totalSteps", total_steps))
            body: dict[str, Any] = {k: int(v) for k, v in counts if v is not None}
        except Exception as err:  # never the training's failure
            self._say(f"not reported (epoch and steps are whole numbers): {type(err).__name__}: {err}")
            return
        body["metrics"] = _clean_metrics(metrics)
        self._last = dict(body)
        self._put(body)

    def confirm(self, request: str, step: int | None = None, path: str = "", timeout: float = 10.0) -> bool:
        """Tell the operator that the checkpoint it asked for (`request`) is saved, with the step it
        holds and where: sent at once (not after the reports' interval), with the latest report's
        counts. True once the operator took it, within `timeout`."""
        if not self.enabled:
            return False
        checkpoint: dict[str, Any] = {"request": str(request)[:63], "path": str(path)[:1024]}
        if step is not None:
            checkpoint["step"] = int(step)
        self._put({**self._last, "checkpoint": checkpoint})
        return self.flush(timeout)

    def _put(self, body: dict[str, Any]) -> None:
        with self._lock:
            self._pending = body
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="disttrain-progress", daemon=True)
                self._thread.start()
            self._lock.notify_all()

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until the latest report is sent (or `timeout`): at the end of training."""
        deadline = time.monotonic() + timeout
        with self._lock:
            self._hurry = True
            self._lock.notify_all()
            while self._pending is not None or self._sending:
                left = deadline - time.monotonic()
                if left <= 0 or self._thread is None:
                    return False
                self._lock.wait(left)
        return True

    def _run(self) -> None:
        failures = lookups = 0
        while True:
            with self._lock:
                while self._pending is None:
                    self._lock.wait()
                body, self._pending, self._sending = self._pending, None, True
            wait = self._send(body)
            with self._lock:
                self._sending = False
                if wait and self._pending is None:
                    self._pending = body  # not sent: the latest still, unless a newer one came
                self._lock.notify_all()
            if wait is None:
                failures, pause = 0, self.min_interval  # at most one report every min_interval
            else:
                # A name the resolver couldn't answer for now (EAI_AGAIN) and that never resolved is
                # asked again after the first backoff, not a growing one, for QUICK_LOOKUPS tries: it
                # cost the operator nothing, and a fresh clone's e2e run lost a whole Horovod
                # training's reports (17 s) to a busy node's DNS and the backoff that followed. A name
                # that doesn't exist (NXDOMAIN), or a resolver down for longer, backs off as before.
                lookups = lookups + 1 if self._unresolved else 0
                failures = 0 if 0 < lookups <= QUICK_LOOKUPS else failures + 1
                pause = max(wait, min(BACKOFF[1], BACKOFF[0] * 2 ** max(0, failures - 1)))
            # The pause; a flush cuts it short to what the operator asked for (Retry-After), so that the
            # end of training doesn't wait out a backoff.
            with self._lock:
                started = time.monotonic()
                while (left := started + (self._told if self._hurry else pause) - time.monotonic()) > 0:
                    self._lock.wait(left)
                self._hurry = False

    def _send(self, body: dict[str, Any]) -> float | None:
        """None when sent or refused for good; else the seconds to wait before trying again."""
        url, self._told, self._unresolved = urllib.parse.urlsplit(self.url), 0.0, False
        connection = http.client.HTTPSConnection(url.hostname or "", url.port or 443, timeout=self.timeout,
                                                 context=self._ssl())
        connection._create_connection = self._connect  # type: ignore[attr-defined]
        try:
            connection.request("POST", url.path, body=json.dumps(body).encode(), headers={
                "Content-Type": "application/json", "Authorization": f"Bearer {self._read('token')}"})
            answer = connection.getresponse()
            text = answer.read()
        except (OSError, ValueError, http.client.HTTPException) as err:  # unreachable, TLS, timeout
            self._say(f"not sent ({type(err).__name__}: {err}); retrying with backoff")
            return BACKOFF[0]
        finally:
            connection.close()
        if answer.status < 300:
            self.sent += 1
            return None
        if answer.status == 429 or answer.status >= 500:  # throttled, or the operator's trouble: later
            self._told = float(answer.getheader("Retry-After") or 0)
            return self._told or BACKOFF[0]
        self.refused += 1
        self._say(f"refused ({answer.status}): {text.decode(errors='replace')[:300]}")
        return None

    def _connect(self, address: tuple[str, int], timeout: float | None = None,
                 source_address: Any = None) -> socket.socket:
        """socket.create_connection, except that a name which doesn't resolve this time is reached at
        the addresses it had the last time it did: a resolver's hiccup (a busy node's DNS timing out:
        an e2e run lost 20 s of reports to `Temporary failure in name resolution`) costs no report.
        TLS still checks the certificate against the name."""
        try:
            self._addresses[address] = socket.getaddrinfo(*address, type=socket.SOCK_STREAM)
        except socket.gaierror as err:
            if address not in self._addresses:
                self._unresolved = err.errno == socket.EAI_AGAIN
                raise
        error: OSError = OSError(f"no address for {address[0]}")
        for family, kind, proto, _, sockaddr in self._addresses[address]:
            sock = socket.socket(family, kind, proto)
            try:
                sock.settimeout(timeout)
                sock.connect(sockaddr)
                return sock
            except OSError as err:
                sock.close()
                error = err
        raise error

    def _ssl(self) -> ssl.SSLContext:
        if self._context is None:
            self._context = ssl.create_default_context(cafile=os.path.join(self.directory, "ca.crt"))
        return self._context

    def _say(self, message: str) -> None:
        """Once per kind of trouble, on stderr: the training's log is not the place for more."""
        kind = message.split(":", 1)[0]
        if kind not in self._said:
            self._said.add(kind)
            print(f"disttrain_progress: {message}", file=sys.stderr, flush=True)


class _Silent:
    """A reporter that reports nothing: the ranks other than 0."""

    enabled = False
    role = None

    def report(self, *args: Any, **kwargs: Any) -> None:
        return None

    def flush(self, timeout: float = 5.0) -> bool:
        return True

    def confirm(self, request: str, step: int | None = None, path: str = "", timeout: float = 10.0) -> bool:
        return False


_default: Reporter | None = None


def reporter() -> Reporter:
    """This process's reporter (made on first use; flushed at exit)."""
    global _default
    if _default is None:
        _default = Reporter()
        if _default.enabled:
            atexit.register(_default.flush, 3.0)
    return _default


def report(epoch: int | None = None, total_epochs: int | None = None, step: int | None = None,
           total_steps: int | None = None, metrics: dict[str, Any] | None = None) -> None:
    reporter().report(epoch=epoch, total_epochs=total_epochs, step=step, total_steps=total_steps, metrics=metrics)


def flush(timeout: float = 5.0) -> bool:
    return reporter().flush(timeout)


_confirmed: set[str] = set()


def request_in_file(directory: str | None = None) -> str | None:
    """What the checkpoint-request file says now (confirmed or not); None when it asks nothing."""
    where = directory or os.environ.get("DISTTRAIN_CHECKPOINT_DIR") or CHECKPOINT_DIR
    try:
        with open(os.path.join(where, "request"), encoding="utf-8") as file:
            return file.read(128).strip() or None
    except OSError:
        return None


def checkpoint_requested(directory: str | None = None) -> str | None:
    """The id of the checkpoint the operator asks for before it stops this job's pods, until this
    process confirms it; None when none is asked. Every rank of every pod sees the same id."""
    request = request_in_file(directory)
    return request if request is not None and request not in _confirmed else None


def confirm_checkpoint(request: str, step: int | None = None, path: str = "", timeout: float = 10.0) -> bool:
    """The training's reporting rank's confirmation that the checkpoint `request` is saved (`step`,
    `path`): the operator stops the pods then rather than at its deadline. Every rank may call it;
    only the training's reporter (chief, worker 0, MPI rank 0) sends, the others return False (an
    evaluator's save, or a Horovod rank's before rank 0 saved, is not the training's checkpoint; the
    operator ignores them too). `checkpoint_requested()` is None after it, on every rank."""
    _confirmed.add(request)
    sink = reporter()
    if sink.role != "training" or mpi_rank() not in (None, 0):
        return False
    return sink.confirm(request, step=step, path=path, timeout=timeout)


# Where an MPI launcher (Open MPI, MPICH's PMI, horovodrun's Gloo) tells a process its rank: in an
# MPI job every pod may report, so only rank 0's process does (as for_rank).
RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "HOROVOD_RANK")


def mpi_rank(environ: Mapping[str, str] | None = None) -> int | None:
    """This process's MPI rank, as its launcher set it; None outside MPI (TensorFlow's pods: the
    volume says who reports)."""
    found = os.environ if environ is None else environ
    for name in RANK_VARIABLES:
        if found.get(name, "").isdigit():
            return int(found[name])
    return None


def for_rank(rank: int) -> Reporter | _Silent:
    """Horovod: rank 0's reporter; a silent one for every other rank."""
    return reporter() if rank == 0 else _Silent()


_CALLBACK_TROUBLE: set[str] = set()


def _never_raises(method: _Method) -> _Method:
    """A callback method whose trouble is said once on stderr and never becomes the training's
    (the e2e ParameterServer run: a coordinator's batch logs that were not a dict failed model.fit)."""
    @functools.wraps(method)
    def guarded(*args: Any, **kwargs: Any) -> None:
        try:
            method(*args, **kwargs)
        except Exception as err:
            if method.__name__ not in _CALLBACK_TROUBLE:
                _CALLBACK_TROUBLE.add(method.__name__)
                print(f"disttrain_progress: {method.__name__} skipped: {type(err).__name__}: {err}",
                      file=sys.stderr, flush=True)
    return guarded  # type: ignore[return-value]


def keras_callback(target: Reporter | _Silent | None = None, every_seconds: float = 5.0) -> Any:
    """A Keras callback reporting epochs at their end and steps every `every_seconds`, with the
    logs' metrics (loss, accuracy, ...), and flushing at the end of training. Keras is imported
    here, not before: the module itself needs nothing but the standard library."""
    import tensorflow as tf

    sink = target if target is not None else reporter()

    class ProgressCallback(tf.keras.callbacks.Callback):  # type: ignore[misc]
        _disttrain_progress = True  # startup.py's hook adds none to a fit that has this one

        def __init__(self) -> None:
            super().__init__()
            self.epoch, self.step, self.last = 0, 0, 0.0
            # Batch logs stay tensors until a report reads them (every `every_seconds`): converting
            # them for every batch would wait on the device each step.
            self._supports_tf_logs = True

        def _totals(self) -> tuple[int | None, int | None]:
            epochs, steps = self.params.get("epochs"), self.params.get("steps")
            return epochs, (epochs * steps if epochs and steps else None)

        @_never_raises
        def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            self.epoch = epoch

        @_never_raises
        def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
            steps = self.params.get("steps") or 0
            self.step = self.epoch * steps + batch + 1
            if time.monotonic() - self.last >= every_seconds:
                self.last = time.monotonic()
                epochs, total_steps = self._totals()
                sink.report(epoch=self.epoch, total_epochs=epochs, step=self.step, total_steps=total_steps,
                            metrics=logs)

        @_never_raises
        def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            epochs, total_steps = self._totals()
            steps = self.params.get("steps") or 0
            sink.report(epoch=epoch + 1, total_epochs=epochs, step=(epoch + 1) * steps or None,
                        total_steps=total_steps, metrics=logs)
            self.last = time.monotonic()

        @_never_raises
        def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
            sink.flush(5.0)

    return ProgressCallback()
