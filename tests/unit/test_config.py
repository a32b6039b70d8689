"""Configuration is read in one module: no module of the package but `mcp_durable/config.py`
touches the environment (`os.environ`, `os.getenv`, `from os import environ`), and its
functions parse what they read."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from mcp_durable import config
from mcp_durable.errors import ConfigError

PACKAGE_DIR = Path(config.__file__).parent
#: Where the environment may be read: the configuration module, and the power-loss harness's
#: test-only switch `MCP_DURABLE_TEST_SKIP_FSYNC`, read where it acts (journal/fsync.py).
ALLOWED = {"config.py", "journal/fsync.py"}
ENV_NAMES = {"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"}


def environment_reads(path: Path) -> list[int]:
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and node.attr in ENV_NAMES and isinstance(node.value, ast.Name):
            if node.value.id == "os":
                lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            if any(alias.name in ENV_NAMES for alias in node.names):
                lines.append(node.lineno)
    return lines


def test_only_the_config_module_reads_the_environment() -> None:
    found = {
        f"{path.relative_to(PACKAGE_DIR)}:{line}"
        for path in PACKAGE_DIR.rglob("*.py")
        if path.relative_to(PACKAGE_DIR).as_posix() not in ALLOWED
        for line in environment_reads(path)
    }
    assert found == set(), f"read the environment outside mcp_durable/config.py: {sorted(found)}"
    assert environment_reads(PACKAGE_DIR / "config.py"), "the walker finds no read in config.py itself"


def test_settings_are_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(config.ADMINS, " alice, ,bob ")
    monkeypatch.setenv(config.TOKENS, "t1=alice, t2=bob")
    monkeypatch.setenv(config.JOURNAL, "")
    assert config.admins(trust_env=True) == {"alice", "bob"}
    assert config.tokens(trust_env=True) == {"t1": "alice", "t2": "bob"}
    assert config.journal_url(trust_env=True) is None  # empty is unset
    monkeypatch.setenv(config.TOKENS, "t1")
    with pytest.raises(ConfigError):
        config.tokens(trust_env=True)


def test_no_setting_is_read_unless_the_environment_is_trusted(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = {
        config.JOURNAL: "memory://",
        config.TOKENS: "t1=alice",
        config.ADMINS: "ops",
        config.INSTANCE: "replica-1",
        config.UPSTREAM_TOKEN: "up",
    }
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    readers = (config.journal_url, config.tokens, config.admins, config.instance, config.upstream_token)
    assert config.trusts_environment() is False  # the library's process default
    assert [bool(read()) for read in readers] == [False] * 5
    assert [bool(read(False)) for read in readers] == [False] * 5
    assert [bool(read(True)) for read in readers] == [True] * 5
    with config.environment_used():  # what the command line does
        assert config.trusts_environment() is True
        assert [bool(read()) for read in readers] == [True] * 5
        assert config.tokens(False) is None  # an explicit False wins over the process default
    assert config.trusts_environment() is False  # restored


def test_secrets_stay_out_of_a_child_environment() -> None:
    environ = {config.TOKENS: "t=a", config.UPSTREAM_TOKEN: "x", "PATH": "/bin"}
    assert config.without_secrets(environ) == {"PATH": "/bin"}
