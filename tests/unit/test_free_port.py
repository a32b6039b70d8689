"""`tests.helpers.free_port` under pytest-xdist: two workers are never handed one port."""

from __future__ import annotations

import socket

import pytest

from tests.helpers import free_port


@pytest.mark.parametrize("worker", ["gw0", "gw1", "gw2"])
def test_each_worker_is_handed_only_ports_of_its_own_share(worker: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "3")
    monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
    mine = int(worker[2:])
    ports = [free_port() for _ in range(30)]
    assert all(port // 2 % 3 == mine for port in ports), ports
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", ports[-1]))  # and it is a port that can be bound
