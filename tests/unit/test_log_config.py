"""How every process logs (`shared/log_config.py`): the text and JSON formats, the request
log's line in both, RQ's per-job lines kept for DEBUG, and the two settings."""

from __future__ import annotations

import io
import json
import logging
import logging.config
from collections.abc import Iterator

import pytest
from pydantic import ValidationError

from tokenrelay.shared.log_config import REQUEST_FIELDS, REQUEST_LOGGER, logging_config
from tokenrelay.shared.settings import Settings


@pytest.fixture
def streams() -> Iterator[tuple[io.StringIO, io.StringIO]]:
    """Apply a config (`apply`) writing to two buffers (stderr, stdout); put the logging
    the test run had back afterwards."""
    root, requests = logging.getLogger(), logging.getLogger(REQUEST_LOGGER)
    saved = (root.handlers[:], root.level, requests.handlers[:], requests.level)
    saved_propagate = requests.propagate
    yield io.StringIO(), io.StringIO()
    root.handlers[:], root.level, requests.handlers[:], requests.level = saved
    requests.propagate = saved_propagate


def apply(level: str, log_format: str, stderr: io.StringIO, stdout: io.StringIO) -> None:
    config = logging_config(level, log_format)
    config["handlers"]["stderr"]["stream"] = stderr
    config["handlers"]["requests"]["stream"] = stdout
    logging.config.dictConfig(config)


def request_line(fields: dict[str, object]) -> None:
    logging.getLogger(REQUEST_LOGGER).info(json.dumps(fields), extra={REQUEST_FIELDS: fields})


def test_json_lines_carry_level_logger_pid_and_a_traceback_in_the_same_line(
    streams: tuple[io.StringIO, io.StringIO],
) -> None:
    stderr, stdout = streams
    apply("INFO", "json", stderr, stdout)
    try:
        raise ValueError("boom")
    except ValueError:
        logging.getLogger("tokenrelay.worker.x").exception("job %s failed", "j1")
    [line] = stderr.getvalue().splitlines()
    record = json.loads(line)
    assert (record["level"], record["logger"]) == ("ERROR", "tokenrelay.worker.x")
    assert record["message"] == "job j1 failed" and isinstance(record["pid"], int)
    assert "Traceback" in record["exc_info"] and "ValueError: boom" in record["exc_info"]


def test_text_lines_name_the_time_level_and_logger(
    streams: tuple[io.StringIO, io.StringIO],
) -> None:
    stderr, stdout = streams
    apply("INFO", "text", stderr, stdout)
    logging.getLogger("tokenrelay.serve").info("ready")
    logging.getLogger("tokenrelay.serve").debug("not shown")
    [line] = stderr.getvalue().splitlines()
    assert line.endswith(" INFO tokenrelay.serve: ready") and line[:4].isdigit()


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_the_request_log_is_one_json_object_per_request_on_stdout(
    streams: tuple[io.StringIO, io.StringIO], log_format: str
) -> None:
    stderr, stdout = streams
    apply("INFO", log_format, stderr, stdout)
    fields = {"method": "POST", "path": "/v1/chat/completions", "status": 200, "job_id": "j1"}
    request_line(fields)
    [line] = stdout.getvalue().splitlines()
    logged = json.loads(line)
    assert {key: logged[key] for key in fields} == fields
    if log_format == "json":
        assert (logged["level"], logged["logger"]) == ("INFO", REQUEST_LOGGER)
    else:
        assert logged == fields
    assert stderr.getvalue() == ""


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_rqs_per_job_lines_show_only_at_debug(
    streams: tuple[io.StringIO, io.StringIO], log_format: str
) -> None:
    stderr, stdout = streams
    rq_log = logging.getLogger("rq.worker")
    apply("INFO", log_format, stderr, stdout)
    rq_log.info("tokenrelay:m:normal: j1")
    rq_log.warning("could not connect to Redis")
    assert "j1" not in stderr.getvalue()
    assert "could not connect to Redis" in stderr.getvalue()
    apply("DEBUG", log_format, stderr, stdout)
    rq_log.info("tokenrelay:m:normal: j2")
    [shown] = [line for line in stderr.getvalue().splitlines() if "j2" in line]
    assert "DEBUG" in shown and "rq.worker" in shown


def test_the_settings_take_levels_and_formats_as_people_type_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TOKENRELAY_LOG_LEVEL", raising=False)
    monkeypatch.delenv("TOKENRELAY_LOG_FORMAT", raising=False)
    assert (Settings().log_level, Settings().log_format) == ("INFO", "text")
    monkeypatch.setenv("TOKENRELAY_LOG_LEVEL", "debug")
    monkeypatch.setenv("TOKENRELAY_LOG_FORMAT", "JSON")
    settings = Settings()
    assert (settings.log_level, settings.log_format) == ("DEBUG", "json")
    monkeypatch.setenv("TOKENRELAY_LOG_FORMAT", "yaml")
    with pytest.raises(ValidationError, match="log_format"):
        Settings()
