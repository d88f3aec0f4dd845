"""`GET /metrics`: Prometheus text format (see `api.metrics` for the names)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Header
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

from tokenrelay.api.cluster_view import read_gauges
from tokenrelay.api.deps import StateDep, get_admin, get_caller
from tokenrelay.api.metrics import MetricsDep

router = APIRouter(tags=["metrics"])


async def check_access(
    state: StateDep, authorization: Annotated[str | None, Header()] = None
) -> None:
    """With `TOKENRELAY_METRICS_REQUIRE_ADMIN`, an admin key (when keys are configured)."""
    if state.settings.metrics_require_admin:
        await get_admin(state, await get_caller(state, authorization))


@router.get("/metrics", include_in_schema=False, dependencies=[Depends(check_access)])
async def scrape(state: StateDep, metrics: MetricsDep) -> Response:
    """Open like the probes by default (as in vLLM and TGI): it carries no prompts, keys or
    job ids. `TOKENRELAY_METRICS_REQUIRE_ADMIN=1` closes it to all but admin keys."""
    body = await metrics.render(await read_gauges(state))
    return Response(body, media_type=CONTENT_TYPE_LATEST)
