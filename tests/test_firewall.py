"""Packet-filter rules that drop a job's traffic (analyzer/firewall.py, collectors/host.py).

The rules are made by the real ``iptables`` / ``nft`` in a network namespace of the test's own,
and read back from the real ``iptables-save`` / ``nft list ruleset`` output; collect's host
step runs in that namespace as root and as an unprivileged user. Needs root, ``ip``,
``iptables`` and ``nft``; skipped, with the reason, without them.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddp_autopsy.analyzer import firewall as fw

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ("ip", "iptables", "iptables-save", "nft", "setpriv")
WHY_NOT = ("needs root" if os.geteuid() != 0 else
           next((f"needs `{t}`" for t in TOOLS if shutil.which(t) is None), None))
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=f"firewall: {WHY_NOT}")

JOB = fw.JobTraffic(ifaces={"fab0"}, ports={29400},
                    addrs=[ipaddress.ip_address("10.213.9.1"), ipaddress.ip_address("10.213.9.2")])


@pytest.fixture
def netns() -> Iterator[str]:
    name = f"ddpafw{uuid.uuid4().hex[:6]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


def _in(ns: str, *argv: str) -> str:
    return subprocess.run(["ip", "netns", "exec", ns, *argv], check=True, capture_output=True,
                          text=True).stdout


def _rules(ns: str, *commands: str) -> fw.Ruleset:
    for command in commands:
        _in(ns, "sh", "-c", command)
    return fw.ruleset({"iptables-save": _in(ns, "iptables-save"),
                       "ip6tables-save": _in(ns, "ip6tables-save"),
                       "nft": _in(ns, "nft", "list", "ruleset")})


def _blocking(rs: fw.Ruleset) -> list[str]:
    return [r.text for r in rs.rules if fw.blocks(r, JOB)]


def test_drop_on_the_jobs_interface_port_or_peer(netns: str) -> None:
    rs = _rules(netns,
                "iptables -A INPUT -i fab0 -j DROP",
                "iptables -A OUTPUT -o fab0 -j DROP",
                "iptables -N GUARD && iptables -A INPUT -j GUARD",
                "iptables -A GUARD -p tcp --dport 29000:29999 -j REJECT",
                "iptables -A INPUT -p tcp --dport 29400 ! -s 10.213.9.1 -j DROP",
                "nft add table inet site && nft add chain inet site in "
                "'{ type filter hook input priority 0; }' && "
                "nft add rule inet site in ip saddr 10.213.9.0/24 drop")
    found = _blocking(rs)
    assert "-A INPUT -i fab0 -j DROP" in found
    assert "-A OUTPUT -o fab0 -j DROP" in found
    assert any("--dport 29000:29999" in t for t in found)  # in a chain INPUT jumps to
    assert any("! -s 10.213.9.1/32" in t for t in found)  # drops 10.213.9.2, a peer
    assert "ip saddr 10.213.9.0/24 drop" in found  # nft's own table
    # iptables-nft's tables are listed by nft too: each rule is counted once
    assert len(found) == 5, found


def test_default_deny_after_accepts(netns: str) -> None:
    """A catch-all DROP after ACCEPTs: it drops the job's traffic unless an ACCEPT before it
    takes all of it (the job's data ports are not known: an ACCEPT of the master port alone
    leaves them to the DROP)."""
    rs = _rules(netns,
                "iptables -A INPUT -p tcp --dport 22 -j ACCEPT",
                "iptables -A INPUT -p tcp --dport 29400 -j ACCEPT",
                "iptables -A INPUT -j DROP",
                "iptables -A OUTPUT -o fab0 -j ACCEPT",
                "iptables -A OUTPUT -j REJECT")
    assert _blocking(rs) == ["-A INPUT -j DROP"]


def test_near_miss_rules_that_spare_the_job_stay_quiet(netns: str) -> None:
    rs = _rules(netns,
                "iptables -A OUTPUT -o fab0 -j ACCEPT",  # ACCEPT, then...
                "iptables -A OUTPUT -o fab0 -j DROP",  # ...a DROP it never reaches
                "iptables -A INPUT -p tcp --dport 22 -j DROP",  # another port
                "iptables -A INPUT -p udp -j DROP",  # not TCP
                "iptables -A INPUT -i docker0 -j DROP",  # another interface
                "iptables -A INPUT -s 192.168.7.0/24 -j REJECT",  # not a peer
                "iptables -A INPUT -m conntrack --ctstate INVALID -j DROP",  # state: not judged
                "iptables -A FORWARD -o fab0 -j DROP",  # routed traffic, not the node's own
                "iptables -N UNUSED && iptables -A UNUSED -j DROP",  # nothing jumps there
                "ip6tables -A INPUT -p tcp --dport 29400 -j DROP")  # IPv6: the job is IPv4
    assert rs.rules  # the parser saw the blocking rules, and judged them
    assert _blocking(rs) == []


def test_collect_keeps_the_rules_and_says_when_it_may_not(netns: str, tmp_path: Path) -> None:
    """collect's host step: as root the dumps land in ``host/firewall/``; as an unprivileged
    user each is ``permission_denied`` in host.json, and nothing fails."""
    _in(netns, "iptables", "-A", "INPUT", "-i", "fab0", "-j", "DROP")
    snippet = (
        "import sys; from pathlib import Path\n"
        "from ddp_autopsy.collectors import bundle, host\n"
        "b = bundle.Bundle(Path(sys.argv[1]), bundle.Deadline(30))\n"
        "res = {k: host.run_command(b, k, 5.0) for k in host.COMMANDS}\n"
        "host.write_host_json(b, res, limits_pid=None, step=5.0)\n")
    out = {}
    shared = Path(tempfile.mkdtemp(prefix="ddpafw-"))  # pytest's tmp_path is root's only
    try:
        os.chmod(shared, 0o777)
        for who, prefix in (("root", []),
                            ("nobody", ["setpriv", "--reuid", "65534", "--regid", "65534",
                                        "--clear-groups"])):
            subprocess.run(["ip", "netns", "exec", netns, *prefix, sys.executable, "-c",
                            snippet, str(shared / who)], check=True, cwd=ROOT, timeout=60,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
            shutil.copytree(shared / who, tmp_path / who)
            out[who] = tmp_path / who
    finally:
        shutil.rmtree(shared, ignore_errors=True)
    facts = json.loads((out["root"] / "host" / "host.json").read_text())
    assert facts["firewall"]["iptables-save"] == "ok"
    saved = (out["root"] / "host" / "firewall" / "iptables-save.txt").read_text()
    assert "-A INPUT -i fab0 -j DROP" in saved
    facts = json.loads((out["nobody"] / "host" / "host.json").read_text())
    assert facts["firewall"]["iptables-save"] == "permission_denied", facts["firewall"]
    assert facts["firewall"]["nft"] in ("permission_denied", "error"), facts["firewall"]
    assert not (out["nobody"] / "host" / "firewall" / "iptables-save.txt").exists()


def test_the_nodes_rules_against_the_jobs_own_traffic(netns: str) -> None:
    """The real cell (link_drop on the master's node, 2x2, live): node-0's rules drop the job's
    interface. The same node with a container bridge's usual rules (its own interface and
    subnet) drops nothing of the job's."""
    from ddp_autopsy.analyzer.job import load

    case = ROOT / "tests" / "rules" / "cases" / "NCCL004-firewall-master-cut-2x2"
    job = load(sorted(p for p in case.iterdir() if p.is_dir()))
    found = fw.blocking_rules(job)
    assert {h: [r.text for r in rules] for h, rules in found.items()} == {
        "node-0": ["-A INPUT -i fab0 -j DROP", "-A OUTPUT -o fab0 -j DROP"]}
    rs = {"iptables-save": _in(netns, "sh", "-c",
                               "iptables -A INPUT -i docker0 -j DROP && "
                               "iptables -A INPUT -s 172.17.0.0/16 -j DROP && "
                               "iptables -A OUTPUT -d 172.17.0.0/16 -j REJECT && "
                               "iptables-save")}
    node0 = next(b for b in job.bundles if b.manifest.get("host") == "node-0")
    node0.firewall = rs
    node0.host_info = {**node0.host_info, "interfaces": [
        *node0.host_info["interfaces"],
        {"name": "docker0", "addresses": ["172.17.0.1/16"], "up": True, "loopback": False}]}
    assert fw.blocking_rules(job) == {}
