"""`disttrain`: run the operator, print the CRD, or render the objects of a job.

    disttrain run [--namespace NS ...] [--leader-election] [--metrics-port 8080] [--progress-port 8443]
    disttrain crd
    disttrain render job.yaml
    disttrain logs JOB [-n NS] [-f] [--type worker] [--previous]   (also: kubectl disttrain logs ...)
    disttrain progress JOB [-n NS] [-f]                             (also: kubectl disttrain progress ...)
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from disttrain.runtime.flags import add_job_arguments, add_run_arguments

if TYPE_CHECKING:
    from disttrain.endpoint.forked import Prefork
    from disttrain.runtime.health import Health


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("disttrain")
    except PackageNotFoundError:  # run from a source tree, not installed
        return "(not installed)"


class _DefaultsOnce(argparse.ArgumentDefaultsHelpFormatter):
    """Each flag's default, unless its help already says it (`default: the whole cluster`) or has none."""

    def _get_help_string(self, action: argparse.Action) -> str:
        said = action.help or ""
        if "default" in said.lower() or action.default in (None, [], argparse.SUPPRESS):
            return said
        return super()._get_help_string(action) or said


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="disttrain", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"disttrain {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    add_run_arguments(sub.add_parser("run", help="run the operator",
                                     formatter_class=_DefaultsOnce))
    sub.add_parser("crd", help="print the DistTrainJob CRD")
    render_cmd = sub.add_parser("render", help="print every object the operator would create for a job",
                                description="Every object the operator would create for the job, offline. What "
                                "only a cluster knows is a placeholder in angle brackets: the job's uid, the "
                                "release's name and namespace, the endpoint's CA, and the hook image "
                                "(<registry>/disttrain/operator:VERSION: the chart's image.registry).")
    render_cmd.add_argument("file", type=Path, help="a DistTrainJob manifest, or - for standard input (with any "
                            "ResourceClaimTemplates, ResourceClaims and DeviceClasses its pods' claims name)")
    render_cmd.add_argument("--gpu-device-class", action="append", default=[], metavar="NAME",
                            help="a DeviceClass whose devices are GPUs (as the operator's flag of the same name)")
    render_cmd.add_argument("--no-progress", dest="progress", action="store_false",
                            help="as an operator without the progress endpoint (the chart's progress.enabled=false) "
                            "would make them: no progress or checkpoint volume, address or label")
    logs = add_job_arguments(sub.add_parser("logs", help="every pod's log of a job, each line prefixed [worker-1]"),
                             "as lines arrive, through restarts, until the job succeeds or fails")
    logs.add_argument("--type", dest="replica_type", choices=["chief", "ps", "worker", "evaluator", "launcher"],
                      help="only the pods of this replica type")
    logs.add_argument("--previous", "-p", action="store_true", help="the containers' logs before their last restart")
    add_job_arguments(sub.add_parser("progress", help="a job's training progress and its curves, as its pods report "
                                     "them"), "redraw as it changes, until the job ends")
    args = parser.parse_args(argv)

    if args.command == "crd":
        from disttrain.api.crd import crd_yaml

        sys.stdout.write(crd_yaml())
        return 0
    if args.command == "render":
        return _render(args.file, args.gpu_device_class, args.progress)
    if args.command == "logs":
        from disttrain.client.commands import logs_command

        return logs_command(args.job, namespace=args.namespace, follow=args.follow, replica_type=args.replica_type,
                            previous=args.previous, kubeconfig=args.kubeconfig, context=args.context)
    if args.command == "progress":
        from disttrain.client.commands import progress_command

        return progress_command(args.job, namespace=args.namespace, follow=args.follow, kubeconfig=args.kubeconfig,
                                context=args.context)
    return _run(args)


def _missing_operator_dependency() -> str | None:
    import importlib.util

    return next((m for m in ("kopf", "cryptography", "prometheus_client")
                 if importlib.util.find_spec(m) is None), None)


def _configure_logging(verbose: bool) -> None:
    import logging

    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not verbose:
        # kopf logs every handled event at INFO: at thousands of pods that is the whole log.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
        logging.getLogger("aiohttp.access").setLevel(logging.WARNING)  # a line per liveness probe


def _progress_settings(args: argparse.Namespace) -> Any:
    if not args.progress_port:
        return None
    from urllib.parse import urlsplit

    from disttrain.watch.handlers import ProgressSettings

    url = args.progress_url or f"https://127.0.0.1:{args.progress_port}"
    namespace, _, name = args.progress_tls_secret.rpartition("/")
    host = urlsplit(url).hostname or "127.0.0.1"
    return ProgressSettings(port=args.progress_port, url=url, secret=(namespace or "default", name),
                            hosts=(host, "localhost", "127.0.0.1"), status_seconds=args.progress_status_seconds,
                            memory_mib=args.progress_memory_mib, hook_image=args.hook_image or None,
                            pods=_endpoint_pods(args.progress_pods, args.progress_port) if args.progress_pods else None)


def _endpoint_pods(text: str, port: int) -> Any:
    """`--progress-pods NAMESPACE/KEY=VALUE,...`; a malformed one stops the operator at start-up."""
    import re

    from disttrain.builders.progress import EndpointPods

    # Kubernetes' rules: a namespace is a DNS label; a label key an optional DNS-subdomain prefix
    # and a name; a value a name or empty. A policy the API server refuses would fail every job.
    name = r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)"
    key = re.compile(rf"^([a-z0-9]([-a-z0-9.]{{0,251}}[a-z0-9])?/)?{name}$")
    namespace, _, selector = text.partition("/")
    pairs = [pair.partition("=") for pair in selector.split(",")]
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", namespace) or not selector or any(
            not sep or not key.match(k) or not re.fullmatch(f"{name}?", v) for k, sep, v in pairs):
        raise SystemExit(f"--progress-pods {text!r}: expected NAMESPACE/KEY=VALUE[,KEY=VALUE...] "
                         "with Kubernetes' namespace and label syntax")
    return EndpointPods(namespace, tuple((k, v) for k, _, v in pairs), port)


def _unreachable(err: Exception) -> str:
    if isinstance(err, FileNotFoundError):
        return f"no kubeconfig at {err.filename} (set $KUBECONFIG, or run in a pod)"
    return f"can't reach the API server: {str(err).splitlines()[0] if str(err) else repr(err)}"


def _refused_by_version() -> bool:
    """Before the Lease and the handlers: on too old a cluster, one clear line (and exit 1); on one
    this release wasn't tested on, a warning naming its version."""
    import asyncio
    import logging

    from disttrain.apiserver.credentials import login
    from disttrain.runtime.preflight import check_kubernetes_version

    try:
        problem, note = asyncio.run(check_kubernetes_version(login))
    except Exception as err:  # no kubeconfig, unreachable, a 403: one line, not a traceback of kopf's login
        problem, note = _unreachable(err), None
    if problem:
        logging.getLogger("disttrain").error(problem)
    elif note:
        logging.getLogger("disttrain").warning(note)
    return problem is not None


def _render(file: Path, gpu_device_classes: list[str], progress: bool) -> int:
    import importlib.util

    from disttrain.api.parse import SpecError
    from disttrain.builders.claims import UncountableClaim
    from disttrain.builders.render import render
    from disttrain.builders.render_input import RenderRefused

    name = "<stdin>" if str(file) == "-" else str(file)
    try:
        text = sys.stdin.read() if str(file) == "-" else file.read_text(encoding="utf-8")
    except OSError as err:  # missing, a directory, unreadable
        print(f"{name}: {err.strerror or err}", file=sys.stderr)
        return 1
    except UnicodeDecodeError as err:
        print(f"{name}: not a manifest: byte {err.start} is not UTF-8 text", file=sys.stderr)
        return 1
    try:
        sys.stdout.write(render(text, gpu_device_classes, progress))
    except RenderRefused as err:  # as `kubectl apply` would refuse it, or no job at all
        print("\n".join(f"{name}: {line}" for line in err.lines), file=sys.stderr)
        return 1
    except (SpecError, UncountableClaim) as err:  # the operator would fail the job with these words
        print(f"{name}: {err}", file=sys.stderr)
        return 1
    if missing := [m for m in ("jsonschema", "celpy") if importlib.util.find_spec(m) is None]:
        print(f"{name}: not checked against the CRD ({', '.join(missing)} missing: pip install jsonschema cel-python)",
              file=sys.stderr)
    return 0


def _run(args: argparse.Namespace) -> int:
    import secrets
    import signal
    import socket

    if missing := _missing_operator_dependency():  # the light install: the client and `logs`/`render` only
        print(f"disttrain run needs the operator's dependencies ({missing} is missing): install the "
              "[operator] extra, from a checkout `pip install '.[operator]'`, or from the wheel `make dist` "
              "builds `pip install 'dist/disttrain-<version>-py3-none-any.whl[operator]'` (disttrain is not on PyPI)",
              file=sys.stderr)
        return 1
    from disttrain.apiserver.client_libraries import keep_out

    keep_out()  # before kopf is imported: it would import them (apiserver/client_libraries.py)
    import prometheus_client

    import disttrain.watch.handlers  # noqa: F401  (registers the handlers)

    _configure_logging(args.verbose)
    from disttrain.apiserver.credentials import login
    from disttrain.runtime.health import Health

    prefork = _prefork() if args.progress_port else None
    health = Health()  # answers the probes from now on, standing by included (runtime/health.py)
    if args.health_port:
        health.serve(args.health_port)
    if _refused_by_version():
        return 1
    if args.metrics_port:
        prometheus_client.start_http_server(args.metrics_port)
    identity = f"{os.environ.get('POD_NAME') or socket.gethostname()}-{secrets.token_hex(3)}"
    # Asked to stop before kopf runs (a standby in a rollout or a scale-down), it stops at once: as
    # a container's PID 1, a signal without a handler is ignored, and the pod waited out its 30 s
    # grace period. kopf.run installs its own handler for a graceful stop.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    leadership = None
    if args.leader_election:
        from disttrain.runtime.leader import lead

        leadership = lead(args.leader_election_namespace, args.lease_name, identity, login, args.lease_duration)
    try:  # nothing acts before kopf runs: whatever ends this process from here, the Lease may go at once
        _operate(args, health, identity, prefork)
    finally:
        # kopf has stopped (SIGTERM) or failed: nothing acts any more, so the standby may lead now,
        # not a Lease duration later (runtime/leader.py).
        if leadership is not None:
            leadership.step_down()
    return 0


def _prefork() -> Prefork | None:
    """Now: every module is imported, and no thread runs yet (endpoint/prefork.py)."""
    from disttrain.endpoint.prefork import prefork_endpoint

    return prefork_endpoint()


def _operate(args: argparse.Namespace, health: Health, identity: str, prefork: Prefork | None = None) -> None:
    """The operator itself, once it leads (or runs alone): kopf's handlers until it stops."""
    import asyncio
    import logging

    import kopf

    from disttrain.apiserver.credentials import login
    from disttrain.runtime.preflight import wait_for_crd

    # Ready only once the CRD is one this operator can run on: an upgrade that skipped applying it
    # leaves the new pod not Ready (`helm upgrade --wait` fails, its log says what to apply).
    asyncio.run(wait_for_crd(logging.getLogger("disttrain"), login))
    health.lead()
    memo = kopf.Memo(workers=args.workers, resync_seconds=args.resync_seconds,
                     name_reuse_seconds=args.name_reuse_seconds, namespaces=list(args.namespace),
                     gpu_device_classes=list(args.gpu_device_class),
                     progress=_progress_settings(args), health=health, endpoint_prefork=prefork)
    kopf.run(
        clusterwide=not args.namespace, namespaces=args.namespace,
        standalone=True,  # one active replica is the Lease's job, not kopf peering's
        # Given, not guessed: kopf's own guess asks for the user's name, and a container run as
        # an arbitrary UID (the chart's 65532, OpenShift's) has none: the operator died at start.
        identity=identity,  # type: ignore[arg-type]  # kopf's Identity is a NewType of str it doesn't export
        memo=memo,
    )


if __name__ == "__main__":
    sys.exit(main())
