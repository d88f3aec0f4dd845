"""The Lua sources: package resources with a header each, spelling no name Python owns."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import redis

from tokenrelay.shared import errors
from tokenrelay.shared.jobs import JobField, JobStatus
from tokenrelay.shared.redis import (
    batch_scripts,
    job_scripts,
    placement,
    plane_scripts,
    scripts,
    webhook_scripts,
)
from tokenrelay.shared.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = {
    job_scripts: (
        "ADMIT",
        "START",
        "FINISH",
        "CANCEL",
        "REAP",
        "HANDOVER",
        "RENEW",
        "REGISTER_WORKER",
        "LIVE_MODELS",
    ),
    plane_scripts: ("EMIT", "OPEN", "CLOSE"),
    webhook_scripts: ("WEBHOOK_TICK", "WEBHOOK_RESCHEDULE", "WEBHOOK_RELEASE"),
    batch_scripts: ("BATCH_CLAIM", "BATCH_RESULT"),
    placement: ("PREFIX_LOOKUP", "SWEEP_WORKER_QUEUES"),
}
_TIME_CALL = re.compile(r"""redis\.p?call\(\s*['"]TIME['"]""")
_STRING_LITERAL = re.compile(r"""'((?:[^'\\]|\\.)*)'|"((?:[^"\\]|\\.)*)\"""")


def lua(name: str) -> str:
    return (scripts.LUA_SOURCES / name).read_text(encoding="utf-8")


def literals(source: str) -> set[str]:
    """The string literals of a Lua source, comments left out."""
    code = "\n".join(line.split("--", 1)[0] for line in source.splitlines())
    return {single or double for single, double in _STRING_LITERAL.findall(code)}


def error_classes(cls: type[errors.TokenrelayError]) -> list[type[errors.TokenrelayError]]:
    return [cls, *(sub for child in cls.__subclasses__() for sub in error_classes(child))]


LUA_FILES = sorted(path.name for path in (ROOT / "shared" / "redis" / "lua").glob("*.lua"))
SOURCES = [getattr(module, name) for module, names in SCRIPTS.items() for name in names]
JOB_FILES = [
    name
    for name in LUA_FILES
    if any(lua(name) in source and lua("library.lua") in source for source in SOURCES)
]
ERROR_TYPES = {cls.error_type for cls in error_classes(errors.TokenrelayError)}
ERROR_MESSAGES = {
    value
    for cls in error_classes(errors.TokenrelayError)
    for name, value in vars(cls).items()
    if name.endswith("_MESSAGE")
}


def test_every_lua_file_is_a_package_resource_used_by_a_script() -> None:
    installed = sorted(p.name for p in scripts.LUA_SOURCES.iterdir() if p.name.endswith(".lua"))
    assert installed == LUA_FILES
    assert "library.lua" in JOB_FILES
    for name in LUA_FILES:
        assert any(lua(name) in source for source in SOURCES), f"{name} is in no script"


@pytest.mark.parametrize("name", LUA_FILES)
def test_each_lua_file_opens_with_a_header_naming_its_keys_and_argv(name: str) -> None:
    source = lua(name)
    header = "\n".join(line for line in source.splitlines() if line.startswith("--"))
    assert source.startswith("-- ")
    assert "KEYS" in header and "ARGV" in header


@pytest.mark.parametrize("name", ["EMIT", "OPEN", "CLOSE"])
def test_token_plane_scripts_build_no_key_names(name: str) -> None:
    """A Redis Cluster runs a script on the node of its KEYS' slot: the token plane's scripts
    reach only those keys, never a name built from a template or read from Redis."""
    source = getattr(plane_scripts, name)
    assert source.startswith(lua("plane.lua"))
    assert lua("library.lua") not in source
    assert "gsub" not in source and "key(" not in source and "T_LOG" not in source


def test_only_the_clock_helper_calls_time() -> None:
    for name in LUA_FILES:
        assert len(_TIME_CALL.findall(lua(name))) == (name == "clock.lua"), name
    clock = lua("clock.lua")
    helper = clock[clock.index("local function now_ms()") :]
    assert _TIME_CALL.search(helper[: helper.index("\nend")])


@pytest.mark.parametrize("name", LUA_FILES)
def test_lua_spells_no_error_type_or_message(name: str) -> None:
    source = lua(name)
    assert not literals(source) & ERROR_TYPES
    assert not [message for message in ERROR_MESSAGES if message in source]


@pytest.mark.parametrize("name", JOB_FILES)
def test_job_scripts_spell_no_job_status_or_hash_field(name: str) -> None:
    names = {str(status) for status in JobStatus} | {str(field) for field in JobField}
    assert not literals(lua(name)) & names


def test_no_lua_is_left_in_python_modules() -> None:
    for package in ("api", "worker", "shared", "cli"):
        for path in (ROOT / package).rglob("*.py"):
            assert "redis.call(" not in path.read_text(encoding="utf-8"), path


def test_library_names_are_compiled_in_from_python(sync_redis: redis.Redis) -> None:
    """Each script on the job library binds, ahead of it, the names it uses from Python's
    (`library_bindings`): a real Redis reads back each F_/S_ name's value and the errors'
    JSON as Python wrote them; the library's own file binds none from ARGV."""
    bindings = job_scripts.library_bindings()
    for name in ("ADMIT", "START", "FINISH", "CANCEL", "REAP"):
        source = getattr(job_scripts, name)
        assert source.index(bindings) < source.index(lua("library.lua"))
    fields = set(JobField)
    variables = [
        f"F_{JobField(name).name}" if name in fields else f"S_{JobStatus(name).name}"
        for name in job_scripts.LIBRARY_NAMES
    ]
    read_back = f"{bindings}\nreturn {{{', '.join(variables)}, SCRIPT_ERRORS}}"
    values = sync_redis.eval(read_back, 0)
    assert values == [*job_scripts.LIBRARY_NAMES, job_scripts._ERRORS]
    library = lua("library.lua")
    code = "\n".join(line.split("--", 1)[0] for line in library.splitlines())
    assert max(int(n) for n in re.findall(r"ARGV\[(\d+)\]", code)) <= job_scripts.LIBRARY_ARGC
    assert "unpack(ARGV, 1, 5)" in code and code.count("ARGV") == 3
    assert f"arguments start at ARGV[{job_scripts.LIBRARY_ARGC + 1}]" in library


def test_library_scripts_take_the_documented_header() -> None:
    call = job_scripts.reap(Settings())
    assert len(call.args) == job_scripts.LIBRARY_ARGC + 1
    assert call.source.index("local function now_ms()") < call.source.index("local LEASES")
