"""The network probe: /proc/net/tcp parsing and endpoint probes on real sockets (collectors/network.py)."""

from __future__ import annotations

import os
import socket

import pytest

from ddp_autopsy.collectors import (
    network,
)


def test_proc_net_tcp_parsing_on_real_sockets() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port), timeout=2) as client:
            peer, _ = server.accept()
            with peer:
                sockets = network.tcp_sockets()
                listening = [s for s in sockets if s.local_port == port and s.state == "LISTEN"]
                assert [(s.local_addr, s.uid) for s in listening] == [("127.0.0.1", os.getuid())]
                established = [s for s in sockets if s.state == "ESTABLISHED"
                               and s.local_port == client.getsockname()[1]]
                assert established and established[0].remote_port == port
                assert established[0].remote_addr == "127.0.0.1"
                owners = network.socket_owners({listening[0].inode}, first=[os.getpid()])
                assert owners == {listening[0].inode: os.getpid()}


def test_proc_net_tcp6_parsing() -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    with socket.socket(socket.AF_INET6) as server:
        try:
            server.bind(("::1", 0))
        except OSError:
            pytest.skip("no ::1")
        server.listen()
        port = server.getsockname()[1]
        found = network.listeners(port)
        assert [s.local_addr for s in found] == ["::1"]


def test_probe_endpoint_listening_and_closed() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        entry = network.probe_endpoint("localhost", port, [os.getpid()], timeout=5)
    assert entry["resolves"] is True and "127.0.0.1" in entry["addresses"]
    assert entry["listening_here"] is True and entry["holder_pid"] == os.getpid()
    assert entry["connect"]["ok"] is True
    closed = network.probe_endpoint("127.0.0.1", port, [], timeout=5)  # the socket is closed now
    assert closed["listening_here"] is False and closed["holder_pid"] is None
    assert closed["connect"]["ok"] is False and "Refused" in closed["connect"]["error"]
    bad = network.probe_endpoint("no-such-host.invalid", 29500, [], timeout=3)
    assert bad["resolves"] in (False, None) and bad["connect"]["ok"] is False
