"""The Redis key schema is a contract between processes and versions: pin every string."""

from tokenrelay.shared.redis import keys
from tokenrelay.shared.redis.rq_jobs import queue_model


def test_key_strings_are_pinned() -> None:
    assert keys.leases() == "tokenrelay:leases"
    assert keys.job("abc") == "tokenrelay:job:abc"
    assert keys.job_events("abc") == "tokenrelay:job:{abc}:events"
    assert keys.job_channel("abc") == "tokenrelay:job:{abc}:channel"
    assert keys.job_text("abc") == "tokenrelay:job:{abc}:text"
    assert keys.token_plane_outbox() == "tokenrelay:token-plane:outbox"
    assert keys.cancel_channel() == "tokenrelay:cancel"
    assert keys.owner_jobs("abc") == "tokenrelay:owner:abc:jobs"
    assert keys.models() == "tokenrelay:models"
    assert keys.worker("w1") == "tokenrelay:worker:w1"
    assert keys.recent_jobs() == "tokenrelay:recent-jobs"
    assert keys.rejections() == "tokenrelay:rejections"
    assert keys.migrations() == "tokenrelay:migrations"
    assert keys.replication_mark() == "tokenrelay:replication-mark"
    assert keys.tokenizer("ab12") == "tokenrelay:tokenizer:ab12"
    assert keys.chat_template("ab12") == "tokenrelay:chat-template:ab12"
    assert keys.generation_queue("Qwen/Qwen2-0.5B-Instruct", "high") == (
        "tokenrelay:Qwen/Qwen2-0.5B-Instruct:high"
    )


def test_placement_key_strings_are_pinned_and_a_workers_queue_is_no_models_queue() -> None:
    assert keys.worker_queue("w1", "high") == "tokenrelay:worker:w1:queue-high"
    assert keys.placement_workers("m") == "tokenrelay:model:m:placement-workers"
    assert keys.prefix_index("m", 42) == "tokenrelay:model:m:prefix-index:42"
    assert queue_model(keys.worker_queue("w1", "high")) is None
    assert queue_model(keys.generation_queue("m", "high")) == "m"


def test_lua_templates_expand_to_the_same_keys() -> None:
    expanded = [t.replace(keys.ID_PLACEHOLDER, "abc") for t in keys.JOB_KEY_TEMPLATES]
    assert expanded == [
        keys.job("abc"),
        keys.job_events("abc"),
        keys.job_channel("abc"),
        keys.job_text("abc"),
    ]
    reader = keys.READER_CHANNEL_TEMPLATE.replace(keys.ID_PLACEHOLDER, "abc")
    assert reader == keys.reader_channel("abc")


def test_webhook_key_strings_are_pinned() -> None:
    assert keys.webhook_deliveries() == "tokenrelay:webhooks:deliveries"
    assert keys.webhook_retries() == "tokenrelay:webhooks:retries"
    assert keys.webhook_processing("d1") == "tokenrelay:webhooks:processing:d1"
    assert keys.webhook_dispatchers() == "tokenrelay:webhooks:dispatchers"


def test_responses_key_strings_are_pinned() -> None:
    assert keys.response("resp_abc") == "tokenrelay:response:resp_abc"
    assert keys.unsettled_responses() == "tokenrelay:responses:unsettled"
