"""Keys and operator surfaces, in-process against a real Redis: owner ids are an HMAC under
`TOKENRELAY_OWNER_ID_SECRET` (and survive a rotation with the previous secret), `/metrics` can
require an admin key, and `/docs`, `/openapi.json` and `/ui` can be switched off."""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

import redis
from fastapi.testclient import TestClient

from tokenrelay.api.api_keys import KeyRing, hash_key
from tokenrelay.api.app import create_app
from tokenrelay.shared.jobs import JobField
from tokenrelay.shared.redis import keys
from tokenrelay.shared.settings import Settings

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
OLD_SECRET, NEW_SECRET = "owner-secret-one", "owner-secret-two"


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def app_settings(redis_url: str, **fields: Any) -> Settings:
    return Settings(
        redis_url=redis_url,
        served_model_name="m",
        api_keys=["key-a", "key-b"],
        admin_api_keys=["key-admin"],
        **fields,
    )


def stored_owner(redis_url: str, job_id: str) -> str:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        return str(client.hget(keys.job(job_id), JobField.OWNER))
    finally:
        client.close()


def test_owner_id_is_an_hmac_of_the_key_hash_under_the_secret(redis_url: str) -> None:
    with TestClient(create_app(app_settings(redis_url, owner_id_secret=OLD_SECRET))) as client:
        job_id = client.post("/v1/jobs", json=BODY, headers=bearer("key-a")).json()["id"]
    owner = stored_owner(redis_url, job_id)
    key_hash = hashlib.sha256(b"key-a").digest()
    assert owner == hmac.new(OLD_SECRET.encode(), key_hash, hashlib.sha256).hexdigest()[:24]
    assert owner not in hash_key("key-a")  # not the unsalted hash the keys file holds


def test_a_rotated_secret_keeps_jobs_with_their_owner_through_the_previous_one(
    redis_url: str,
) -> None:
    with TestClient(create_app(app_settings(redis_url, owner_id_secret=OLD_SECRET))) as client:
        old_job = client.post("/v1/jobs", json=BODY, headers=bearer("key-a")).json()["id"]
    rotated = app_settings(
        redis_url, owner_id_secret=NEW_SECRET, owner_id_previous_secret=OLD_SECRET
    )
    with TestClient(create_app(rotated)) as client:
        assert client.get(f"/v1/jobs/{old_job}", headers=bearer("key-a")).status_code == 200
        assert client.get(f"/v1/jobs/{old_job}", headers=bearer("key-b")).status_code == 404
        new_job = client.post("/v1/jobs", json=BODY, headers=bearer("key-a")).json()["id"]
        assert client.delete(f"/v1/jobs/{old_job}", headers=bearer("key-a")).status_code == 200
    assert stored_owner(redis_url, new_job) != stored_owner(redis_url, old_job)
    finished = app_settings(redis_url, owner_id_secret=NEW_SECRET)  # the previous one dropped
    with TestClient(create_app(finished)) as client:
        assert client.get(f"/v1/jobs/{new_job}", headers=bearer("key-a")).status_code == 200
        assert client.get(f"/v1/jobs/{old_job}", headers=bearer("key-a")).status_code == 404


def test_every_key_is_found_and_no_other(redis_url: str) -> None:
    ring = KeyRing.from_settings(app_settings(redis_url, owner_id_secret=OLD_SECRET))
    found = {key: ring.lookup(key) for key in ("key-a", "key-b", "key-admin")}
    assert all(policy is not None for policy in found.values())
    assert len({policy.owner for policy in found.values() if policy}) == 3
    assert found["key-admin"] is not None and found["key-admin"].is_admin
    for guess in ("key-", "key-a ", "", "key-c", "KEY-A"):
        assert ring.lookup(guess) is None


def test_metrics_can_require_an_admin_key(redis_url: str) -> None:
    with TestClient(create_app(app_settings(redis_url))) as client:
        assert client.get("/metrics").status_code == 200  # open by default, like the probes
    closed = app_settings(redis_url, metrics_require_admin=True)
    with TestClient(create_app(closed)) as client:
        assert client.get("/metrics").json()["error"]["code"] == "invalid_api_key"
        assert client.get("/metrics", headers=bearer("key-a")).status_code == 403
        scrape = client.get("/metrics", headers=bearer("key-admin"))
        assert scrape.status_code == 200
        assert "tokenrelay_redis_up" in scrape.text


def test_docs_openapi_and_console_can_be_switched_off(redis_url: str) -> None:
    with TestClient(create_app(app_settings(redis_url))) as client:
        for path in ("/docs", "/redoc", "/openapi.json", "/ui/"):
            assert client.get(path).status_code == 200, path
    closed = app_settings(redis_url, docs_enabled=False, console_enabled=False)
    with TestClient(create_app(closed)) as client:
        for path in ("/docs", "/redoc", "/openapi.json", "/ui", "/ui/", "/ui/console.js"):
            response = client.get(path, headers=bearer("key-admin"))
            assert response.status_code == 404, path
            assert response.json()["error"]["code"] == "not_found"
        assert client.get("/v1/models", headers=bearer("key-a")).status_code == 200
