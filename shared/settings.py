"""Settings shared by the API and the worker, read from `TOKENRELAY_*` environment variables.

Every field here has a row in the one settings table, docs/operations/settings.md.
"""

from __future__ import annotations

import base64
from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

DEFAULT_MODEL = "Qwen/Qwen2-0.5B-Instruct"
DEMO_MODEL_NAME = "tokenrelay-demo"
#: What `--demo` of `tokenrelay serve` and `tokenrelay worker` accepts (`worker.devmodels.demo`):
#: the flag alone means `auto`.
DEMO_CHOICES = ("auto", "qwen2.5-coder", "tiny")
#: How the API reads tool calls out of a model's replies (`api.openai.tool_calls`): `qwen`
#: (vLLM calls the same format `hermes`) for `<tool_call>` tags, `json` for a reply that is
#: one JSON call, bare or in a ```json block.
ToolCallParserName = Literal["qwen", "hermes", "json"]
WEBHOOK_SECRET_PREFIX = "whsec_"
WEBHOOK_SECRET_BYTES = (24, 64)


def webhook_signing_key(secret: str) -> bytes:
    """The HMAC key of a Standard Webhooks secret, `whsec_` + base64 of 24 to 64 random bytes."""
    low, high = WEBHOOK_SECRET_BYTES
    encoded = secret.removeprefix(WEBHOOK_SECRET_PREFIX)
    try:
        key = base64.b64decode(encoded, validate=True)
    except ValueError:
        key = b""
    if not secret.startswith(WEBHOOK_SECRET_PREFIX) or not low <= len(key) <= high:
        raise ValueError(
            f"TOKENRELAY_WEBHOOK_SECRET must be `{WEBHOOK_SECRET_PREFIX}` followed by the base64 "
            f"of {low} to {high} random bytes, e.g. whsec_$(openssl rand -base64 32)"
        )
    return key


class Settings(BaseSettings):
    """Configuration of one tokenrelay process (API node or worker)."""

    model_config = SettingsConfigDict(env_prefix="TOKENRELAY_", extra="ignore")

    redis_url: str = "redis://127.0.0.1:6379/0"
    redis_sentinels: Annotated[list[tuple[str, int]], NoDecode] = Field(default_factory=list)
    redis_sentinel_master: str = "mymaster"
    redis_sentinel_password: SecretStr | None = None
    redis_min_replicas: int = Field(default=0, ge=0)
    stream_redis_url: str = ""
    stream_redis_cluster: bool = False
    redis_pool_size: int = Field(default=32, ge=2)
    worker_redis_pool_size: int = Field(default=8, ge=3)
    api_redis_timeout_s: float = Field(default=5.0, ge=2.0)
    model: str = DEFAULT_MODEL
    served_model_name: str = ""
    tool_call_parser: ToolCallParserName = "qwen"
    max_inflight: int = Field(default=64, ge=1)
    max_queue_wait_s: float = Field(default=60.0, gt=0)
    lease_ttl_s: float = Field(default=15.0, ge=1.0)
    max_tokens_limit: int = Field(default=4096, ge=1)
    default_max_tokens: int = Field(default=512, ge=1)
    job_timeout_s: int = Field(default=1800, ge=1)
    result_ttl_s: int = Field(default=3600, ge=1)
    event_log_maxlen: int = Field(default=20_000, ge=100)
    sse_ping_s: float = Field(default=15.0, gt=0)
    max_request_bytes: int = Field(default=1_048_576, ge=1)
    api_header_timeout_s: float = Field(default=10.0, gt=0)
    api_body_timeout_s: float = Field(default=30.0, gt=0)
    api_keep_alive_timeout_s: int = Field(default=5, ge=1)
    api_max_connections: int = Field(default=1000, ge=1)
    api_keys: Annotated[list[str], NoDecode] = Field(default_factory=list)
    admin_api_keys: Annotated[list[str], NoDecode] = Field(default_factory=list)
    api_keys_file: str = ""
    owner_id_secret: SecretStr | None = None
    owner_id_previous_secret: SecretStr | None = None
    metrics_require_admin: bool = False
    docs_enabled: bool = True
    console_enabled: bool = True
    worker_drain_s: float = Field(default=60.0, ge=0)
    api_drain_s: int = Field(default=30, ge=2)
    job_max_attempts: int = Field(default=3, ge=1)
    worker_concurrency: int = Field(default=8, ge=1)
    worker_max_batch_tokens: int = Field(default=32_768, ge=16)
    worker_max_prefill_tokens: int = Field(default=2048, ge=16)
    prefix_cache_bytes: int = Field(default=1_073_741_824, ge=0)
    prefix_cache_block_tokens: int = Field(default=16, ge=1, le=4096)
    prefix_placement: Literal["on", "off"] = "on"
    prefix_placement_max_backlog: int = Field(default=4, ge=1)
    prefix_placement_block_tokens: int = Field(default=64, ge=1, le=4096)
    prefix_placement_ttl_s: int = Field(default=600, ge=10)
    vllm_cpu_max_model_len: int = Field(default=4096, ge=16)
    flush_interval_ms: float = Field(default=50.0, ge=0)
    engine: Literal["transformers", "vllm", "synthetic"] = "transformers"
    allow_synthetic_engine: bool = False
    synthetic_tokens_per_s: float = Field(default=20.0, gt=0)
    synthetic_first_token_ms: float = Field(default=0.0, ge=0)
    synthetic_lockstep: bool = True
    log_prompts: bool = False
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    log_format: Literal["text", "json"] = "text"
    truncate_messages: bool = False
    cache_dir: str = "~/.cache/tokenrelay"
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    webhook_secret: SecretStr | None = None
    webhook_allowed_hosts: Annotated[list[str], NoDecode] = Field(default_factory=list)
    webhook_allow_private: bool = False
    webhook_timeout_s: float = Field(default=10.0, gt=0, le=10.0)
    webhook_max_attempts: int = Field(default=10, ge=1)
    webhook_backoff_s: float = Field(default=2.0, gt=0)
    webhook_visibility_timeout_s: float = Field(default=30.0, ge=1.0)
    file_max_bytes: int = Field(default=209_715_200, ge=1)
    file_max_requests: int = Field(default=50_000, ge=1)
    file_retention_s: int = Field(default=2_592_000, ge=60)
    batch_completion_window_s: float = Field(default=86_400.0, gt=0)
    batch_max_inflight_share: float = Field(default=0.5, gt=0, le=1)
    batch_line_max_attempts: int = Field(default=3, ge=1)
    batch_lease_s: float = Field(default=10.0, ge=1.0)
    responses_ttl_s: int = Field(default=2_592_000, ge=60)

    @field_validator("api_keys", "admin_api_keys", mode="before")
    @classmethod
    def _split_api_keys(cls, value: object) -> object:
        if isinstance(value, str):
            return [key.strip() for key in value.split(",") if key.strip()]
        return value

    @field_validator("redis_sentinels", mode="before")
    @classmethod
    def _split_sentinels(cls, value: object) -> object:
        """`host1:26379,host2:26379` → [(host, port), ...]."""
        if not isinstance(value, str):
            return value
        sentinels = []
        for item in (part.strip() for part in value.split(",")):
            if not item:
                continue
            host, _, port = item.rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(
                    f"TOKENRELAY_REDIS_SENTINELS: {item!r} is not host:port "
                    "(e.g. sentinel-0:26379,sentinel-1:26379)"
                )
            sentinels.append((host.strip("[]"), int(port)))
        return sentinels

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper_case(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) else value

    @field_validator("log_format", mode="before")
    @classmethod
    def _lower_case(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value

    @field_validator("redis_sentinel_password", mode="before")
    @classmethod
    def _empty_is_none(cls, value: object) -> object:
        return None if value == "" else value

    @field_validator("webhook_allowed_hosts", mode="before")
    @classmethod
    def _split_webhook_hosts(cls, value: object) -> object:
        """`a.example.com, .example.org` → exact names and suffixes, lower case, no final dot."""
        if isinstance(value, str):
            value = value.split(",")
        if isinstance(value, list):
            hosts = (str(host).strip().lower().rstrip(".").strip("[]") for host in value)
            return [host for host in hosts if host]
        return value

    @field_validator("owner_id_secret", "owner_id_previous_secret", mode="before")
    @classmethod
    def _empty_secret_is_none(cls, value: object) -> object:
        return None if value == "" else value

    @field_validator("webhook_secret", mode="before")
    @classmethod
    def _check_webhook_secret(cls, value: object) -> object:
        if value == "":
            return None
        if isinstance(value, str):
            webhook_signing_key(value)
        return value

    @model_validator(mode="after")
    def _check_bounds(self) -> Settings:
        if self.engine == "synthetic" and not self.allow_synthetic_engine:
            raise ValueError(
                "TOKENRELAY_ENGINE=synthetic serves no real text and is for benchmarks only; "
                "set TOKENRELAY_ALLOW_SYNTHETIC_ENGINE=1 as well to use it"
            )
        if self.default_max_tokens > self.max_tokens_limit:
            raise ValueError(
                f"TOKENRELAY_DEFAULT_MAX_TOKENS ({self.default_max_tokens}) must be <= "
                f"TOKENRELAY_MAX_TOKENS_LIMIT ({self.max_tokens_limit})"
            )
        return self

    @property
    def model_id(self) -> str:
        """The name clients send as `model` and see in `/v1/models`."""
        return self.served_model_name or self.model

    @property
    def token_plane_shared(self) -> bool:
        """Whether the control Redis also holds the token plane (no `stream_redis_url`)."""
        return not self.stream_redis_url

    @property
    def lease_ttl_ms(self) -> int:
        return int(self.lease_ttl_s * 1000)

    @property
    def max_queue_wait_ms(self) -> int:
        return int(self.max_queue_wait_s * 1000)

    @property
    def batch_max_inflight(self) -> int:
        """How many admission slots batch lines may hold at once, at least one."""
        return max(1, int(self.max_inflight * self.batch_max_inflight_share))

    @property
    def webhook_key(self) -> bytes | None:
        """The webhook HMAC key (decoded `TOKENRELAY_WEBHOOK_SECRET`); None when unset."""
        if self.webhook_secret is None:
            return None
        return webhook_signing_key(self.webhook_secret.get_secret_value())
