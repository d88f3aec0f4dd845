"""Placement by prefix, the API's side: which worker's own queue an admitted job goes to.

A worker's prefix cache (`worker.engines.prefix_cache`) skips the prefill of a prompt's
blocks it already holds, so a follow-up turn of a conversation is fastest on the worker
that ran the turn before. At admission (`control.submit`, the one door every generating
route goes through) this module renders and tokenizes the prompt as the worker will
(`PromptFit.prompt_ids`), hashes its whole blocks (`placement.prompt_blocks`), and asks the
prefix index which worker started a job with the deepest of them (one script,
`placement.lookup`). The job goes to that worker's queue unless

- placement is off (`TOKENRELAY_PREFIX_PLACEMENT=off`), the prompt has no whole block, or
  the workers have not published their tokenizer, template and block size: no lookup;
- no worker holds any of its blocks, or the holder is not live in this process's view;
- fewer than two workers are live (one worker drains every queue anyway);
- the holder's backlog (jobs waiting in its own queues) is `TOKENRELAY_PREFIX_PLACEMENT_MAX_BACKLOG`
  or more above the least backlogged live worker's: waiting behind it would cost more than
  the prefill it saves;

and then it goes to the model's queue, exactly as without placement. The view of live
workers and their backlogs is read at most every `VIEW_REFRESH_S` per process and model, by
the sweep that hands dead workers' queues over (`placement.sweep`), and counts the jobs this
process placed since; ADMIT itself refuses a worker that left or died (it checks the worker
is listed live in the script that pushes). Placement never fails an admission: a Redis
error in the lookup sends the job to the model's queue.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from redis.exceptions import RedisError

from tokenrelay.api.jobs.prompt_fit import PromptFit
from tokenrelay.shared.generation import GenerationRequest
from tokenrelay.shared.redis import placement
from tokenrelay.shared.redis.scripts import AsyncScripts
from tokenrelay.shared.settings import Settings

log = logging.getLogger(__name__)

VIEW_REFRESH_S = 1.0
"""How long a process trusts its view of a model's live workers and their backlogs."""
PREFIX = "prefix"
SHARED = "shared"
"""The outcomes counted (`tokenrelay_placements_total{queue}`): a worker's own queue, or
the model's (only for jobs with a whole block whose workers publish a block size)."""


class Placement:
    def __init__(
        self,
        settings: Settings,
        scripts: AsyncScripts,
        prompt_fit: PromptFit,
        count: Callable[[str], None] | None = None,
    ) -> None:
        """`count`, where given, is told each hashed job's outcome, `PREFIX` or `SHARED`."""
        self._settings = settings
        self._scripts = scripts
        self._prompt_fit = prompt_fit
        self._count = count or (lambda outcome: None)
        #: model → (when read, monotonic s; live worker → backlog)
        self._views: dict[str, tuple[float, dict[str, int]]] = {}

    async def choose(self, request: GenerationRequest) -> str:
        """The worker whose queue should take `request`'s job, or "" for the model's queue."""
        if self._settings.prefix_placement == "off":
            return ""
        try:
            worker = await self._choose(request)
        except RedisError as exc:
            log.warning("placement by prefix skipped: %s", exc)
            return ""
        if worker is not None:
            self._count(PREFIX if worker else SHARED)
        return worker or ""

    async def _choose(self, request: GenerationRequest) -> str | None:
        """As `choose`, None for a job that was not hashed."""
        limits = await self._prompt_fit.limits(request.model)
        block_tokens = limits.prefix_block_tokens if limits is not None else 0
        if not block_tokens:
            return None
        ids = await self._prompt_fit.prompt_ids(request, at_least=block_tokens)
        if ids is None:
            return None
        blocks = placement.prompt_blocks(request.model, ids, block_tokens)
        call = placement.lookup(self._settings, request.model, blocks)
        holder = placement.parse_lookup(await self._scripts.run(call))
        if holder is None:
            return ""
        backlogs = await self._view(request.model)
        if len(backlogs) < 2 or holder.worker not in backlogs:
            return ""
        least = min(backlogs.values())
        if backlogs[holder.worker] - least >= self._settings.prefix_placement_max_backlog:
            return ""
        backlogs[holder.worker] += 1
        return holder.worker

    async def _view(self, model: str) -> dict[str, int]:
        read_at, backlogs = self._views.get(model, (float("-inf"), {}))
        if time.monotonic() - read_at < VIEW_REFRESH_S:
            return backlogs
        swept = placement.parse_sweep(await self._scripts.run(placement.sweep(model)))
        if swept.moved:
            log.info("handed %d jobs placed on stopped workers to the model's queues", swept.moved)
        self._views[model] = (time.monotonic(), swept.backlogs)
        return swept.backlogs
