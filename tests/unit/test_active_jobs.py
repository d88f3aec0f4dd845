"""A worker's registry of running jobs: what its lease keeper reads of the runner's jobs."""

from __future__ import annotations

from tokenrelay.worker.active_jobs import ActiveJobs


def test_a_job_is_ending_from_its_finish_until_it_leaves() -> None:
    """The lease keeper says nothing of a job whose lease its own FINISH removed (a FINISH
    that waits for a replica overlapped renewals: a warning per job of a failover's window)."""
    active = ActiveJobs()
    active.ending("gone")
    assert not active.is_ending("gone"), "a job that does not run here"
    assert active.add("j") and not active.is_ending("j")
    active.ending("j")
    assert active.is_ending("j")
    active.remove("j")
    assert not active.is_ending("j")
    assert active.add("j") and not active.is_ending("j"), "a second run starts afresh"
