"""A gang job's scheduling provider: chosen once, from the gang APIs the cluster serves, and kept in
its status with the API version its group is made as."""

from __future__ import annotations

from disttrain.api.spec import GangProvider
from disttrain.api.status import Phase
from disttrain.builders import gang
from disttrain.decide.passes import Pass
from disttrain.decide.plan import Event
from disttrain.decide.reasons import Reason


def choose_provider(p: Pass) -> bool:
    """A gang job's provider, chosen once (from what the cluster serves) and kept in its status."""
    settings = p.spec.run_policy.scheduling.gang
    if settings is None:
        return False
    if p.provider is not None:
        keep_api_current(p)
        return False
    provider = gang.choose(settings, gang.providers(p.job.gang_apis), p.spec.run_policy.scheduling.scheduler_name)
    if provider is None:
        return p.finish(Phase.FAILED, Reason.GANG_UNAVAILABLE, (
            f"runPolicy.scheduling.gang.provider {settings.provider.value}: this cluster serves no "
            f"{'gang-scheduling API' if settings.provider is GangProvider.AUTO else 'API of that provider'} "
            f"({', '.join(f'{a} PodGroup' for p in gang.API for a in gang.apis(p))})"))
    conflict = gang.scheduler_conflict(p.spec, provider)
    if conflict is not None:
        return p.finish(Phase.FAILED, Reason.INVALID_SPEC, conflict)
    size = gang.min_available(p.spec, settings)
    api = gang.api_version(provider, p.job.gang_apis)
    p.plan.status["gang"] = {"provider": provider.value, "apiVersion": api, "podGroup": gang.group_name(p.job.ref.name),
                             "minAvailable": size}
    how = "chosen by Auto from the APIs this cluster serves" if settings.provider is GangProvider.AUTO else "asked for"
    p.plan.events.append(Event("Normal", Reason.GANG_SCHEDULING, (
        f"{size} pods are scheduled together by {provider.value} ({api} PodGroup "
        f"{gang.group_name(p.job.ref.name)}; {how})")))
    return False


def keep_api_current(p: Pass) -> None:
    """status.gang.apiVersion follows what the cluster serves now (Pass.gang_api): a job chosen on
    1.36 and resumed, restarted or taken over after an upgrade to 1.37 makes its group as v1beta1."""
    chosen = p.plan.status.get("gang") or {}
    now = p.gang_api
    if now is None or chosen.get("apiVersion") in (None, now):
        return
    p.plan.status["gang"] = {**chosen, "apiVersion": now}
    p.plan.events.append(Event("Normal", Reason.GANG_SCHEDULING, (
        f"the cluster serves {now}, not {chosen['apiVersion']}: PodGroup {chosen.get('podGroup')} is made as {now}")))
