"""How every tokenrelay process logs (`serve`, `api`, `worker`): `TOKENRELAY_LOG_LEVEL` and
`TOKENRELAY_LOG_FORMAT`, applied by one `logging.config.dictConfig` dictionary.

- `text` (the default) writes `time LEVEL logger: message` lines, for people.
- `json` writes one JSON object per line, for a log pipeline: `ts`, `level`, `logger`,
  `pid`, `message`, and a traceback, when there is one, as `exc_info` in the same object.

The request log (`REQUEST_LOGGER`, written by `api/middleware/request_log.py`) is one JSON
object per request in both formats, on stdout; with `json` it also carries `level` and
`logger`. Everything else goes to stderr. RQ logs a few INFO lines per job (dequeued, done,
result kept): they are demoted to DEBUG, so they show only with `TOKENRELAY_LOG_LEVEL=DEBUG`.
"""

from __future__ import annotations

import json
import logging
import logging.config
import os
from typing import Any

REQUEST_LOGGER = "tokenrelay.requests"
REQUEST_FIELDS = "tokenrelay_request"
"""The attribute of a request log record that holds its fields (`extra={REQUEST_FIELDS: …}`)."""
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_CHATTY_LIBRARIES = frozenset({"rq"})
HF_PROGRESS_BARS_OFF = "HF_HUB_DISABLE_PROGRESS_BARS"


class JsonFormatter(logging.Formatter):
    """One JSON object per record; a request log record's fields at its top level."""

    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname,
            "logger": record.name,
            "pid": record.process,
        }
        request = getattr(record, REQUEST_FIELDS, None)
        if isinstance(request, dict):
            fields.update(request)
        else:
            fields["message"] = record.getMessage()
        if record.exc_info:
            fields["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(fields, ensure_ascii=False, default=str)


class RequestLineFormatter(logging.Formatter):
    """The request log in the text format: the line's JSON alone (its message)."""

    def format(self, record: logging.LogRecord) -> str:
        return record.getMessage()


class QuietLibraries(logging.Filter):
    """A handler's filter: INFO records of chatty libraries become DEBUG records, and records
    below `threshold` are dropped (the logger's own level let them through as INFO)."""

    def __init__(self, threshold: int) -> None:
        super().__init__()
        self.threshold = threshold

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.INFO and record.name.split(".")[0] in _CHATTY_LIBRARIES:
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return record.levelno >= self.threshold


def logging_config(level: str = "INFO", log_format: str = "text") -> dict[str, Any]:
    """The `dictConfig` dictionary of a process: the root logger at `level` on stderr, the
    request log on stdout, both in `log_format` (`text` or `json`)."""
    json_format = log_format == "json"
    quiet = {"()": QuietLibraries, "threshold": logging.getLevelName(level)}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {
            "text": {"format": TEXT_FORMAT},
            "json": {"()": JsonFormatter},
            "request_line": {"()": RequestLineFormatter},
        },
        "filters": {"quiet_libraries": quiet},
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "formatter": "json" if json_format else "text",
                "filters": ["quiet_libraries"],
                "stream": "ext://sys.stderr",
            },
            "requests": {
                "class": "logging.StreamHandler",
                "formatter": "json" if json_format else "request_line",
                "stream": "ext://sys.stdout",
            },
        },
        "loggers": {
            REQUEST_LOGGER: {"handlers": ["requests"], "level": level, "propagate": False},
        },
        "root": {"handlers": ["stderr"], "level": level},
    }


def configure(level: str = "INFO", log_format: str = "text") -> None:
    """Apply `logging_config` to this process. With `json`, the progress bars of Hugging
    Face's libraries are turned off too (set before they are imported): they are no log
    records, and would break the one-object-per-line stream."""
    if log_format == "json":
        os.environ.setdefault(HF_PROGRESS_BARS_OFF, "1")
    logging.config.dictConfig(logging_config(level, log_format))
