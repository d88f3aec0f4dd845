"""The stream hub against a real Redis: ordering, no loss, and no needless log replays."""

from __future__ import annotations

import asyncio

import pytest
import redis
import redis.asyncio

from tokenrelay.api.streaming import hub as streams
from tokenrelay.api.streaming.hub import HEARTBEAT, Delivery, StreamHub
from tokenrelay.shared.events import Done, Started, TokenChunk, Usage
from tokenrelay.shared.jobs import JobField
from tokenrelay.shared.redis import job_scripts, keys, plane_scripts
from tokenrelay.shared.redis.scripts import SyncScripts
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
    job_scripts.check_admitted(run.run(job_scripts.admit(settings, "j", "o", "m")))
    run.run(job_scripts.start(settings, "j", "w", Started(worker="w", prompt_tokens=1).to_wire()))

    def race() -> None:
        chunks = [("j", i + 1, TokenChunk(text=f"{i} ", tokens=1).to_wire()) for i in range(20)]
        run.run(plane_scripts.emit(settings, chunks))

    def finish() -> None:
        usage = Usage(prompt_tokens=1, completion_tokens=20, total_tokens=21)
        done = Done(finish_reason="length", usage=usage).to_wire()
        run.run(job_scripts.finish(settings, "j", "succeeded", {}, done))

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


async def test_a_reader_gets_a_heartbeat_after_idle_s_of_silence_and_none_while_events_flow(
    settings: Settings, sync_redis: redis.Redis, async_redis: redis.asyncio.Redis
) -> None:
    """A heartbeat (an SSE ping, and a replay of the log) comes once `idle_s` passed without
    an event, counted from the last one; events spaced closer than that bring none."""
    run = SyncScripts(sync_redis)
    job_scripts.check_admitted(run.run(job_scripts.admit(settings, "j", "o", "m")))
    run.run(job_scripts.start(settings, "j", "w", Started(worker="w", prompt_tokens=1).to_wire()))
    idle_s = 0.3
    loop = asyncio.get_running_loop()
    hub = StreamHub(async_redis)
    hub.start()
    items: list[tuple[float, object]] = []
    seq = 0

    async def emit(count: int, every_s: float) -> None:
        nonlocal seq
        for _ in range(count):
            await asyncio.sleep(every_s)  # the pace of a slow model: the input, not a wait
            seq += 1
            chunk = TokenChunk(text="x", tokens=1).to_wire()
            await asyncio.to_thread(run.run, plane_scripts.emit(settings, [("j", seq, chunk)]))

    async def read() -> None:
        async for item in hub.events("j", idle_s=idle_s):
            items.append((loop.time(), item))
            if isinstance(item, Delivery) and item.event.seq == 10:
                return

    try:
        reader = asyncio.create_task(read())
        await emit(1, 0.0)
        await emit(8, idle_s / 3)  # 0.8 s of events, 0.1 s apart
        await emit(1, idle_s * 2.5)  # then 0.75 s of silence
        await asyncio.wait_for(reader, 10)
    finally:
        await hub.close()
    kinds = ["beat" if item is HEARTBEAT else item.event.seq for _, item in items]  # type: ignore[attr-defined]
    assert kinds[:10] == list(range(10)), kinds
    beats = [i for i, kind in enumerate(kinds) if kind == "beat"]
    assert beats and all(i > 9 for i in beats), kinds  # none while events flowed
    first_beat_at = items[beats[0]][0]
    assert first_beat_at - items[9][0] >= idle_s, "a heartbeat before idle_s of silence"
    assert kinds[-1] == 10 and len(beats) <= 2, kinds


class CountingHub(StreamHub):
    """Counts its log replays: a reader hearing every event live replays once, at its start."""

    replays = 0

    async def _replay(self, job_id: str, after_seq: int):  # type: ignore[no-untyped-def]
        self.replays += 1
        return await super()._replay(job_id, after_seq)


async def _subscribers(client: redis.asyncio.Redis, channel: str) -> int:
    return int((await client.pubsub_numsub(channel))[0][1])


async def test_a_readers_jobs_reach_it_and_another_process_through_the_readers_channel(
    settings: Settings, sync_redis: redis.Redis, async_redis: redis.asyncio.Redis
) -> None:
    """Two jobs whose reader is hub A: A reads one, hub B (another API process, say a client
    that reconnected there) the other; both hear every token live from A's channel, and B
    stops listening there once its reader ends."""
    run = SyncScripts(sync_redis)
    home, other = CountingHub(async_redis), CountingHub(async_redis)
    assert home.reader_id is not None and other.reader_id != home.reader_id
    channel = keys.reader_channel(home.reader_id)
    readers = {"j1": channel, "j2": channel}
    for job_id in readers:
        job_scripts.check_admitted(run.run(job_scripts.admit(settings, job_id, "o", "m")))
        run.run(
            job_scripts.start(settings, job_id, "w", Started(worker="w", prompt_tokens=1).to_wire())
        )
    home.start()
    other.start()

    async def read(hub: StreamHub, job_id: str) -> list[int]:
        seqs = []
        async for item in hub.events(job_id, reader=home.reader_id, idle_s=30):
            assert isinstance(item, Delivery)
            seqs.append(item.event.seq)
        return seqs

    try:
        reading = [asyncio.create_task(read(home, "j1")), asyncio.create_task(read(other, "j2"))]
        async with asyncio.timeout(10):
            while await _subscribers(async_redis, channel) < 2 or not all(
                [await _subscribers(async_redis, keys.job_channel(job_id)) for job_id in readers]
            ):
                await asyncio.sleep(0.01)
        for seq in range(1, 11):
            chunk = TokenChunk(text=f"{seq} ", tokens=1).to_wire()
            events = [(job_id, seq, chunk) for job_id in readers]
            await asyncio.to_thread(run.run, plane_scripts.emit(settings, events, readers))
        usage = Usage(prompt_tokens=1, completion_tokens=10, total_tokens=11)
        done = Done(finish_reason="length", usage=usage).to_wire()
        for job_id in readers:
            await asyncio.to_thread(
                run.run, job_scripts.finish(settings, job_id, "succeeded", {}, done)
            )
        assert await asyncio.wait_for(asyncio.gather(*reading), 10) == [list(range(12))] * 2
        assert (home.replays, other.replays) == (1, 1)  # every token came live
        async with asyncio.timeout(10):
            while await _subscribers(async_redis, channel) != 1:  # B left, A listens on
                await asyncio.sleep(0.01)
    finally:
        await home.close()
        await other.close()


async def test_a_job_read_by_its_reader_needs_no_subscription_of_its_own(
    settings: Settings, sync_redis: redis.Redis, async_redis: redis.asyncio.Redis
) -> None:
    """With one Redis for both planes, a job whose hash names a reader has its `started` and
    final events on that reader's channel too (the job library publishes them there): the
    reader hears the whole job live without subscribing the job's channel, one that runs to
    its end and one cancelled while queued alike, and a new pub/sub connection still makes
    it re-read its log."""
    run = SyncScripts(sync_redis)
    hub = CountingHub(async_redis, plane_shared=True)
    assert hub.reader_id is not None
    channel = keys.reader_channel(hub.reader_id)
    fields = {JobField.READER: hub.reader_id}
    for job_id in ("ran", "dropped"):
        call = job_scripts.admit(settings, job_id, "o", "m", job_fields=fields)
        job_scripts.check_admitted(run.run(call))
    hub.start()

    async def read(job_id: str) -> list[object]:
        return [item.event async for item in hub.events(job_id, reader=hub.reader_id, idle_s=30)]  # type: ignore[union-attr]

    try:
        async with asyncio.timeout(10):
            while await _subscribers(async_redis, channel) < 1:
                await asyncio.sleep(0.01)
        reading = [asyncio.create_task(read(job_id)) for job_id in ("ran", "dropped")]
        async with asyncio.timeout(10):
            while hub.channel_count < 2:
                await asyncio.sleep(0.01)
        started = Started(worker="w", prompt_tokens=1).to_wire()
        run.run(job_scripts.start(settings, "ran", "w", started))
        for seq in range(1, 4):
            chunk = TokenChunk(text=f"{seq} ", tokens=1).to_wire()
            await asyncio.to_thread(
                run.run, plane_scripts.emit(settings, [("ran", seq, chunk)], {"ran": channel})
            )
        run.run(job_scripts.cancel(settings, "dropped"))
        usage = Usage(prompt_tokens=1, completion_tokens=3, total_tokens=4)
        done = Done(finish_reason="length", usage=usage).to_wire()
        run.run(job_scripts.finish(settings, "ran", "succeeded", {}, done, 4))
        ran, dropped = await asyncio.wait_for(asyncio.gather(*reading), 10)
        for job_id in ("ran", "dropped"):
            assert await _subscribers(async_redis, keys.job_channel(job_id)) == 0
    finally:
        await hub.close()
    assert [type(event).__name__ for event in ran] == ["Started", *["TokenChunk"] * 3, "Done"]
    assert [event.seq for event in ran] == list(range(5))  # type: ignore[attr-defined]
    assert [type(event).__name__ for event in dropped] == ["Error"]
    assert hub.replays == 2  # one each, at its start: every event came live


async def test_a_job_heard_from_before_its_admission_replays_nothing(
    settings: Settings, sync_redis: redis.Redis, async_redis: redis.asyncio.Redis
) -> None:
    """A job the hub `expect`s before admitting it hears every event, including those
    published before its reader came, and its reader reads the log not once; a reader of
    a job the hub did not expect replays it as before."""
    run = SyncScripts(sync_redis)
    hub = CountingHub(async_redis, plane_shared=True)
    assert hub.reader_id is not None
    channel = keys.reader_channel(hub.reader_id)
    hub.start()
    try:
        await asyncio.wait_for(hub._confirmed[channel].wait(), 10)  # subscribed
        for job_id in ("expected", "not"):
            if job_id == "expected":
                hub.expect(job_id)
            call = job_scripts.admit(
                settings, job_id, "o", "m", job_fields={JobField.READER: hub.reader_id}
            )
            job_scripts.check_admitted(run.run(call))
            run.run(
                job_scripts.start(
                    settings, job_id, "w", Started(worker="w", prompt_tokens=1).to_wire()
                )
            )
            usage = Usage(prompt_tokens=1, completion_tokens=0, total_tokens=1)
            done = Done(finish_reason="stop", usage=usage).to_wire()
            run.run(job_scripts.finish(settings, job_id, "succeeded", {}, done, 1))
        async with asyncio.timeout(10):
            while hub._expected["expected"][0].qsize() < 2:
                await asyncio.sleep(0.01)  # both events heard before any reader came
        seqs = {}
        for job_id in ("expected", "not"):
            replays = hub.replays
            seqs[job_id] = [
                item.event.seq  # type: ignore[union-attr]
                async for item in hub.events(job_id, reader=hub.reader_id, idle_s=30)
            ]
            seqs[job_id + " replays"] = hub.replays - replays  # type: ignore[assignment]
    finally:
        await hub.close()
    assert seqs == {"expected": [0, 1], "expected replays": 0, "not": [0, 1], "not replays": 1}
    assert hub.channel_count == 0


async def test_an_expected_job_no_reader_takes_over_is_forgotten(
    async_redis: redis.asyncio.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job forgotten (its admission failed) or expected for longer than `_EXPECTED_S`
    without a reader leaves nothing behind; a reader of it would replay the log."""
    hub = StreamHub(async_redis, plane_shared=True)
    assert hub.reader_id is not None
    hub._confirmed[keys.reader_channel(hub.reader_id)].set()
    hub.expect("refused")
    hub.forget("refused")
    assert hub.channel_count == 0 and not hub._via_reader
    monkeypatch.setattr(streams, "_EXPECTED_S", 0.0)
    hub.expect("abandoned")
    hub.expect("next")  # finds the first one past its time
    assert list(hub._expected) == ["next"] and hub.channel_count == 1
    assert list(hub._via_reader) == [keys.job_channel("next")]


async def test_an_older_api_process_hears_a_readers_every_event_once(
    settings: Settings, sync_redis: redis.Redis, async_redis: redis.asyncio.Redis
) -> None:
    """A hub that still subscribes per job (as API processes before reader channels for
    every event did: `plane_shared` off) reads a job whose `started` and final events now
    come on its reader channel: whole, each event once, live (upgrading workers first)."""
    run = SyncScripts(sync_redis)
    hub = CountingHub(async_redis)
    assert hub.reader_id is not None
    channel = keys.reader_channel(hub.reader_id)
    call = job_scripts.admit(settings, "j", "o", "m", job_fields={JobField.READER: hub.reader_id})
    job_scripts.check_admitted(run.run(call))
    hub.start()

    async def read() -> list[int]:
        return [item.event.seq async for item in hub.events("j", reader=hub.reader_id, idle_s=30)]  # type: ignore[union-attr]

    try:
        reading = asyncio.create_task(read())
        async with asyncio.timeout(10):
            while await _subscribers(async_redis, keys.job_channel("j")) < 1:
                await asyncio.sleep(0.01)
        run.run(
            job_scripts.start(settings, "j", "w", Started(worker="w", prompt_tokens=1).to_wire())
        )
        chunk = TokenChunk(text="a", tokens=1).to_wire()
        run.run(plane_scripts.emit(settings, [("j", 1, chunk)], {"j": channel}))
        usage = Usage(prompt_tokens=1, completion_tokens=1, total_tokens=2)
        done = Done(finish_reason="length", usage=usage).to_wire()
        run.run(job_scripts.finish(settings, "j", "succeeded", {}, done, 2))
        assert await asyncio.wait_for(reading, 10) == [0, 1, 2]
    finally:
        await hub.close()
    assert hub.replays == 1


async def test_a_final_event_on_the_jobs_own_channel_reaches_a_reader_after_its_idle_time(
    settings: Settings, sync_redis: redis.Redis, async_redis: redis.asyncio.Redis
) -> None:
    """A job read through its reader channel alone whose final event went on the job's own
    channel (an older worker or API process ended it, mid-upgrade) still ends whole: its
    reader finds the event in the log once it heard nothing for its idle time."""
    run = SyncScripts(sync_redis)
    hub = StreamHub(async_redis, plane_shared=True)
    assert hub.reader_id is not None
    call = job_scripts.admit(settings, "j", "o", "m", job_fields={JobField.READER: hub.reader_id})
    job_scripts.check_admitted(run.run(call))
    run.run(job_scripts.start(settings, "j", "w", Started(worker="w", prompt_tokens=1).to_wire()))
    hub.start()
    idle_s = 0.3
    items: list[object] = []

    async def read() -> None:
        async for item in hub.events("j", reader=hub.reader_id, idle_s=idle_s):
            items.append(item)

    try:
        reading = asyncio.create_task(read())
        async with asyncio.timeout(10):
            while not items:  # the Started event, replayed from the log
                await asyncio.sleep(0.01)
        done = Done(
            finish_reason="stop", usage=Usage(prompt_tokens=1, completion_tokens=0, total_tokens=1)
        )
        payload = plane_scripts.log_payload(1, done.to_wire())
        sync_redis.xadd(keys.job_events("j"), {"e": payload}, id="1-1")
        sync_redis.publish(keys.job_channel("j"), payload)  # heard by no one
        await asyncio.wait_for(reading, 10)
    finally:
        await hub.close()
    assert items[1] is HEARTBEAT
    assert [item.event.seq for item in items if isinstance(item, Delivery)] == [0, 1]


async def test_a_new_connection_resyncs_readers_that_listen_through_a_reader_channel(
    async_redis: redis.asyncio.Redis,
) -> None:
    """A job read through its reader's channel alone is re-read when that channel's
    connection is replaced, as a job with a channel of its own is."""
    hub = StreamHub(async_redis, plane_shared=True)
    assert hub.reader_id is not None
    via_reader: asyncio.Queue[object] = asyncio.Queue()
    own: asyncio.Queue[object] = asyncio.Queue()
    other: asyncio.Queue[object] = asyncio.Queue()
    hub._readers = {keys.job_channel("a"): {via_reader}, keys.job_channel("b"): {own}}
    hub._readers[keys.job_channel("c")] = {other}
    hub._via_reader[keys.job_channel("a")] = keys.reader_channel(hub.reader_id)
    hub.resync({keys.reader_channel(hub.reader_id), keys.job_channel("b")})
    assert via_reader.qsize() == 1 and own.qsize() == 1 and other.empty()


async def test_a_reader_channel_message_with_a_line_short_is_dropped_not_raised(
    async_redis: redis.asyncio.Redis,
) -> None:
    """A message whose last event lost its line (not one EMIT writes) leaves the hub's read
    loop running: the complete pairs before it are delivered, the odd line is dropped."""
    hub = StreamHub(async_redis)
    assert hub.reader_id is not None
    queue: asyncio.Queue[object] = asyncio.Queue()
    hub._readers[keys.job_channel("j")] = {queue}
    event = plane_scripts.log_payload(1, TokenChunk(text="a", tokens=1).to_wire())
    hub.deliver(keys.reader_channel(hub.reader_id), f"j\n{event}\nj")
    delivered = queue.get_nowait()
    assert isinstance(delivered, Delivery) and delivered.raw == event
    assert queue.empty()


async def test_close_streams_ends_every_open_reader_and_any_that_comes_after(
    settings: Settings, sync_redis: redis.Redis, async_redis: redis.asyncio.Redis
) -> None:
    """A stopping API process (`api.streaming.drain`) ends its streams through the hub:
    a reader waiting for a job's next event raises `StreamsClosing`, after what it read; a
    reader that comes later gets what the log holds, then the same end."""
    run = SyncScripts(sync_redis)
    job_scripts.check_admitted(run.run(job_scripts.admit(settings, "j", "o", "m")))
    run.run(job_scripts.start(settings, "j", "w", Started(worker="w", prompt_tokens=1).to_wire()))
    hub = StreamHub(async_redis)
    hub.start()
    read: list[int] = []
    first = asyncio.Event()

    async def reader() -> None:
        async for item in hub.events("j"):
            assert isinstance(item, Delivery)
            read.append(item.event.seq)
            first.set()

    try:
        task = asyncio.create_task(reader())
        await asyncio.wait_for(first.wait(), 10)
        hub.close_streams()
        with pytest.raises(streams.StreamsClosing):
            await asyncio.wait_for(task, 10)
        assert read == [0]
        chunk = TokenChunk(text="x", tokens=1).to_wire()
        await asyncio.to_thread(run.run, plane_scripts.emit(settings, [("j", 1, chunk)]))
        late: list[int] = []

        async def late_reader() -> None:
            async for item in hub.events("j"):
                assert isinstance(item, Delivery)
                late.append(item.event.seq)

        with pytest.raises(streams.StreamsClosing):
            await asyncio.wait_for(late_reader(), 10)
        assert late == [0, 1]  # what the log held, then the end instead of a wait
    finally:
        await hub.close()
