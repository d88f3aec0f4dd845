"""`GET /v1/cluster`: the live cluster view behind the web console (`/ui`)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from tokenrelay.api.cluster_view import ClusterView, read_cluster
from tokenrelay.api.deps import AdminDep, StateDep
from tokenrelay.api.error_docs import AUTH_ERRORS
from tokenrelay.shared.redis.job_scripts import RECENT_JOBS_KEPT

router = APIRouter(prefix="/v1", tags=["cluster"], responses=AUTH_ERRORS)


@router.get("/cluster")
async def cluster(
    state: StateDep,
    _: AdminDep,
    limit: Annotated[
        int, Query(ge=1, le=RECENT_JOBS_KEPT, description="How many recent jobs to list")
    ] = 20,
) -> ClusterView:
    """In-flight jobs against the global limit, queue depths, workers (state, running jobs,
    last heartbeat), the most recent jobs with status and timings, and rejection counts.

    Read from Redis alone, so every API process answers the same. It carries no prompt or
    generated text. With `TOKENRELAY_API_KEYS` or `TOKENRELAY_ADMIN_API_KEYS` set it needs an
    admin key (`Authorization: Bearer <admin key>`; any other valid key gets 403
    `forbidden`); with no keys configured it is open, like every other route.
    """
    return await read_cluster(state, limit)
