"""Which models this cluster serves: the configured one always (its jobs wait for a worker),
others while a live worker has registered for them (`worker.lease_keeper`)."""

from __future__ import annotations

from tokenrelay.api.state import AppState
from tokenrelay.shared.errors import ModelNotFound, ModelUnavailable
from tokenrelay.shared.redis import job_scripts


async def served_models(state: AppState) -> tuple[list[str], list[str]]:
    """(models with a live worker, every model a worker ever served)."""
    live, known = await state.scripts.run(job_scripts.live_models())
    return list(live), list(known)


async def check_model(state: AppState, model: str) -> None:
    """404 for a model nobody serves, 503 for one whose workers are all gone."""
    if model == state.settings.model_id:
        return
    live, known = await served_models(state)
    if model in live:
        return
    if model in known:
        raise ModelUnavailable(
            f"no worker serving model {model!r} is alive right now; retry later", param="model"
        )
    listed = sorted({state.settings.model_id, *live})
    raise ModelNotFound(
        f"model {model!r} is not served here; GET /v1/models lists {listed}", param="model"
    )
