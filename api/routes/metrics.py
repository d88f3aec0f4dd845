"""`GET /metrics`: Prometheus text format (see `api.metrics` for the names)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

from tokenrelay.api.cluster_view import read_gauges
from tokenrelay.api.deps import StateDep
from tokenrelay.api.metrics import MetricsDep

router = APIRouter(tags=["metrics"])


@router.get("/metrics", include_in_schema=False)
async def scrape(state: StateDep, metrics: MetricsDep) -> Response:
    """Open like the probes (as in vLLM and TGI): it carries no prompts, keys or job ids."""
    body = await metrics.render(await read_gauges(state))
    return Response(body, media_type=CONTENT_TYPE_LATEST)
