"""The stream hub against a real Redis: ordering, no loss, and no needless log replays."""

from __future__ import annotations

import redis
import redis.asyncio

from tokenrelay.api.streams import Delivery, StreamHub
from tokenrelay.shared import scripts
from tokenrelay.shared.events import Done, Started, TokenChunk, Usage
from tokenrelay.shared.script_runner import SyncScripts
from tokenrelay.shared.settings import Settings


class RacingHub(StreamHub):
    """Events land (logged and published) between the subscription and the first replay."""

    def __init__(self, client: redis.asyncio.Redis, race: object) -> None:
        super().__init__(client)
        self._race = race
        self.replays = 0

    async def _replay(self, job_id: str, after_seq: int):  # type: ignore[no-untyped-def]
        if self.replays == 0:
            assert callable(self._race)
            self._race()
        self.replays += 1
        return await super()._replay(job_id, after_seq)


async def test_duplicates_of_replayed_events_do_not_trigger_more_replays(
    settings: Settings, sync_redis: redis.Redis, async_redis: redis.asyncio.Redis
) -> None:
    run = SyncScripts(sync_redis)
    scripts.check_admitted(run.run(scripts.admit(settings, "j", "o", "m")))
    run.run(scripts.start(settings, "j", "w", Started(worker="w", prompt_tokens=1).to_wire()))

    def race() -> None:
        chunks = [("j", i + 1, TokenChunk(text=f"{i} ", tokens=1).to_wire()) for i in range(20)]
        run.run(scripts.emit(settings, chunks))

    def finish() -> None:
        usage = Usage(prompt_tokens=1, completion_tokens=20, total_tokens=21)
        done = Done(finish_reason="length", usage=usage).to_wire()
        run.run(scripts.finish(settings, "j", "succeeded", {}, done))

    hub = RacingHub(async_redis, race)
    hub.start()
    seqs: list[int] = []
    try:
        async for delivery in hub.events("j", idle_s=5):
            assert isinstance(delivery, Delivery)
            seqs.append(delivery.event.seq)
            if delivery.event.seq == 20:  # the 20 published copies of replayed events are queued
                finish()
    finally:
        await hub.close()
    assert seqs == list(range(22))
    assert hub.replays == 1
