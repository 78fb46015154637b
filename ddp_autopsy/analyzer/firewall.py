"""Packet-filter rules that drop a job's traffic, from a node's ``iptables-save``,
``ip6tables-save`` and ``nft list ruleset`` output (collect keeps them under ``host/``).

Only rules that certainly apply are kept: a ``DROP`` / ``REJECT`` (nft ``drop`` / ``reject``)
in the local input or output path (the ``filter`` table's INPUT / OUTPUT chains, nft chains
hooked at ``input`` / ``output``, and the chains those jump to) whose every match is one we
can judge: interface (``-i`` / ``-o``, ``iifname`` / ``oifname``, ``+`` / ``*`` wildcards),
protocol (TCP or any), ports (``--dport``, ``--sport``, ``multiport``, ranges, sets) and
addresses (``-s`` / ``-d``, ``ip saddr`` / ``daddr``, CIDR), each possibly negated. A rule
with any other match (connection state, rate limits, marks, sets) is left out: it may drop
nothing of the job's. Chain policies are not judged either.

A rule matches the job when each of its matches admits some of the job's traffic: an
interface the job uses (``*_SOCKET_IFNAME``, or the one holding an address on a peer's
subnet), a job port (the rendezvous / master port), a peer's or this node's address.

iptables-nft shows its own tables in ``nft list ruleset`` too (``table ip filter``): when the
``*-save`` output of that family was read, those nft tables are skipped.
"""

from __future__ import annotations

import ipaddress
import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ddp_autopsy.analyzer.job import Job

IpNet = ipaddress.IPv4Network | ipaddress.IPv6Network
IpAddr = ipaddress.IPv4Address | ipaddress.IPv6Address
#: The ``*-save`` tables whose rules nft also lists (iptables-nft).
XTABLES = ("filter", "nat", "mangle", "raw", "security")
_IGNORED_MODULES = {"comment", "tcp", "udp"}  # "-m tcp" only introduces --dport


@dataclass
class Match:
    """One judged match: values and whether it is negated (``!`` / ``!=``)."""

    values: list[str]
    negated: bool = False


@dataclass
class FilterRule:
    source: str  # iptables-save, ip6tables-save or nft
    chain: str
    text: str  # the rule as printed
    verdict: str  # DROP or REJECT (ACCEPT for the rules in ``accepted_before``)
    family: int | None = None  # 4 or 6 when the rule sees one IP version only
    iface: Match | None = None
    proto: str | None = None
    dports: Match | None = None
    sports: Match | None = None
    saddr: Match | None = None
    daddr: Match | None = None
    #: judged ACCEPT rules earlier in the same chain: packets they take never reach this one
    accepted_before: list[FilterRule] = field(default_factory=list)


@dataclass
class Ruleset:
    """The blocking rules of one node, and the chains the local path reaches."""

    rules: list[FilterRule] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)  # which outputs were read


@dataclass
class JobTraffic:
    """What the job's packets look like from one node."""

    ifaces: set[str]
    ports: set[int]
    addrs: list[IpAddr]  # peers' and this node's addresses


# -- iptables-save ----------------------------------------------------------------------------
def parse_iptables_save(text: str, source: str = "iptables-save") -> list[FilterRule]:
    """Blocking rules of the ``filter`` table reachable from INPUT / OUTPUT."""
    table, rules = "", []
    jumps: dict[str, set[str]] = {}
    pending: list[tuple[str, list[str], str]] = []
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("*"):
            table = line[1:]
            continue
        if table != "filter" or not line.startswith("-A "):
            continue
        try:
            words = shlex.split(line)
        except ValueError:
            continue
        chain = words[1]
        target = _arg(words, ("-j", "--jump")) or _arg(words, ("-g", "--goto"))
        if target and target not in ("DROP", "REJECT", "ACCEPT", "RETURN", "LOG"):
            jumps.setdefault(chain, set()).add(target)
        if target in ("DROP", "REJECT", "ACCEPT"):
            pending.append((chain, words[2:], line))
    reach = _reachable(("INPUT", "OUTPUT"), jumps)
    accepts: dict[str, list[FilterRule]] = {}
    for chain, words, line in pending:
        if chain in reach:
            rule = _judge_iptables(words, source, chain, line)
            if rule is None:
                continue
            rule.family = 6 if source.startswith("ip6") else 4
            _keep(rule, accepts.setdefault(chain, []), rules)
    return rules


def _keep(rule: FilterRule, accepted: list[FilterRule], rules: list[FilterRule]) -> None:
    """An ACCEPT joins its chain's list; any other rule is kept, with the ACCEPTs before it."""
    if rule.verdict == "ACCEPT":
        accepted.append(rule)
    else:
        rule.accepted_before = list(accepted)
        rules.append(rule)


def _arg(words: list[str], names: tuple[str, ...]) -> str | None:
    for i, w in enumerate(words[:-1]):
        if w in names:
            return words[i + 1]
    return None


def _judge_iptables(words: list[str], source: str, chain: str, line: str) -> FilterRule | None:
    rule = FilterRule(source, chain, line, "")
    i, neg = 0, False
    while i < len(words):
        w = words[i]
        val = words[i + 1] if i + 1 < len(words) else ""
        if w == "!":
            neg, i = True, i + 1
            continue
        if w in ("-j", "--jump"):
            rule.verdict = val
            break  # what follows is the target's own options (--reject-with)
        if w in ("-i", "--in-interface", "-o", "--out-interface"):
            rule.iface = Match([val], neg)
        elif w in ("-p", "--protocol"):
            if neg:
                return None
            rule.proto = val.lower()
        elif w in ("-s", "--source", "-d", "--destination"):
            m = Match(val.split(","), neg)
            if w in ("-s", "--source"):
                rule.saddr = m
            else:
                rule.daddr = m
        elif w in ("--dport", "--destination-port", "--dports", "--destination-ports"):
            rule.dports = Match(val.split(","), neg)
        elif w in ("--sport", "--source-port", "--sports", "--source-ports"):
            rule.sports = Match(val.split(","), neg)
        elif w in ("-m", "--match"):
            if val not in _IGNORED_MODULES and val != "multiport":
                return None  # state, limit, set, mark...: cannot tell what it drops
        elif w == "--comment":
            pass
        elif w.startswith("-"):
            return None  # an option we do not judge
        else:
            return None
        neg = False
        i += 2
    return rule if rule.verdict in ("DROP", "REJECT", "ACCEPT") else None


def _reachable(roots: Iterable[str], jumps: dict[str, set[str]]) -> set[str]:
    seen, todo = set(), list(roots)
    while todo:
        chain = todo.pop()
        if chain not in seen:
            seen.add(chain)
            todo += jumps.get(chain, ())
    return seen


# -- nft list ruleset -------------------------------------------------------------------------
_NFT_COUNTER = re.compile(r"\bcounter(?: packets \d+ bytes \d+)?")
_NFT_HOOK = re.compile(r"\btype filter hook (input|output)\b")


def parse_nft(text: str, skip_families: Iterable[str] = ()) -> list[FilterRule]:
    """Blocking rules of nft chains hooked at input / output and the chains they jump to;
    tables ``<family> <xtables name>`` of ``skip_families`` are left to ``*-save``."""
    skip = set(skip_families)
    table: tuple[str, str] | None = None
    chain = ""
    hooked: set[tuple[str, str, str]] = set()
    jumps: dict[tuple[str, str, str], set[tuple[str, str, str]]] = {}
    pending: list[tuple[tuple[str, str, str], str]] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = re.match(r"table (\w+) (\S+) \{", line)
        if m:
            table, chain = (m[1], m[2]), ""
            continue
        m = re.match(r"chain (\S+) \{", line)
        if m and table:
            chain = m[1]
            continue
        if table is None or not chain or line == "}":
            if line == "}" and chain:
                chain = ""
            continue
        here = (*table, chain)
        if table[0] in skip and table[1] in XTABLES:
            continue
        if _NFT_HOOK.search(line):
            hooked.add(here)
            continue
        jm = re.search(r"\b(?:jump|goto) (\S+)$", line)
        if jm:
            jumps.setdefault(here, set()).add((*table, jm[1]))
        if re.search(r"\b(drop|accept|reject(?: with .*)?)$", line):
            pending.append((here, line))
    reach: set[tuple[str, str, str]] = set()
    todo = list(hooked)
    while todo:
        c = todo.pop()
        if c not in reach:
            reach.add(c)
            todo += jumps.get(c, ())
    rules = []
    accepts: dict[tuple[str, str, str], list[FilterRule]] = {}
    for where, line in pending:
        if where in reach:
            rule = _judge_nft(line, where[2])
            if rule is None:
                continue
            rule.family = {"ip": 4, "ip6": 6}.get(where[0])
            _keep(rule, accepts.setdefault(where, []), rules)
    return rules


def _judge_nft(line: str, chain: str) -> FilterRule | None:
    body = _NFT_COUNTER.sub("", line)
    body = re.sub(r"\s+comment \"[^\"]*\"", "", body)
    verdict = "DROP" if re.search(r"\bdrop$", body) else \
        "ACCEPT" if re.search(r"\baccept$", body) else "REJECT"
    body = re.sub(r"\b(drop|accept|reject(?: with .*)?)$", "", body).strip()
    rule = FilterRule("nft", chain, line, verdict)
    # values: a word, a quoted name, or a { set }
    token = r"(!= )?(\{[^}]*\}|\"[^\"]*\"|\S+)"
    pos = 0
    spec = re.compile(r"(iifname|oifname|iif|oif|ip saddr|ip daddr|ip6 saddr|ip6 daddr|"
                      r"tcp dport|tcp sport|meta l4proto|ip protocol|ip6 nexthdr) " + token)
    while pos < len(body):
        m = spec.match(body, pos)
        if not m:
            return None  # ct state, limit, mark...: cannot tell what it drops
        key, neg, value = m[1], bool(m[2]), m[3]
        values = [v.strip().strip('"') for v in value.strip("{}").split(",") if v.strip()]
        if any(v.startswith(("@", "$")) for v in values):
            return None  # a named set or a variable: its members are not in the rule
        if key in ("iifname", "oifname", "iif", "oif"):
            rule.iface = Match(values, neg)
        elif key in ("meta l4proto", "ip protocol", "ip6 nexthdr"):
            if neg or len(values) != 1:
                return None
            rule.proto = values[0].lower()
        elif key.endswith("saddr"):
            rule.saddr = Match(values, neg)
        elif key.endswith("daddr"):
            rule.daddr = Match(values, neg)
        else:
            if rule.proto is None:
                rule.proto = "tcp"
            m_ports = Match([v.replace("-", ":") for v in values], neg)
            if key == "tcp dport":
                rule.dports = m_ports
            else:
                rule.sports = m_ports
        pos = m.end()
        while pos < len(body) and body[pos] == " ":
            pos += 1
    return rule


# -- the node's rules, and the job's traffic ---------------------------------------------------
def ruleset(outputs: dict[str, str]) -> Ruleset:
    """Blocking rules from a node's ``{"iptables-save": text, "ip6tables-save": ..., "nft":
    ...}`` (any may be missing)."""
    out = Ruleset()
    families = []
    for name, family in (("iptables-save", "ip"), ("ip6tables-save", "ip6")):
        text = outputs.get(name)
        if text and text.strip():
            out.sources.append(name)
            out.rules += parse_iptables_save(text, name)
            families.append(family)
    nft = outputs.get("nft")
    if nft and nft.strip():
        out.sources.append("nft")
        out.rules += parse_nft(nft, skip_families=families)
    return out


def _iface_ok(patterns: list[str], ifaces: set[str]) -> bool:
    for pat in patterns:
        for name in ifaces:
            if (pat.endswith(("+", "*")) and name.startswith(pat[:-1])) or pat == name:
                return True
    return False


def _port_ok(specs: list[str], ports: set[int]) -> bool:
    for spec in specs:
        lo, sep, hi = spec.partition(":")
        try:
            a = int(lo) if lo else 0
            b = int(hi) if hi else (65535 if sep else a)
        except ValueError:
            continue
        if any(a <= p <= b for p in ports):
            return True
    return False


def _addr_ok(specs: list[str], addrs: list[IpAddr]) -> bool:
    for spec in specs:
        try:
            net = ipaddress.ip_network(spec, strict=False)
        except ValueError:
            continue
        if any(a.version == net.version and a in net for a in addrs):
            return True
    return False


def _admits(m: Match | None, ok: bool) -> bool:
    """A match admits some of the job's traffic: positive and hit, or negated and missed
    (a negated match admits what it does not list)."""
    return m is None or (ok != m.negated)


def blocks(rule: FilterRule, job: JobTraffic) -> bool:
    """Whether ``rule`` drops some of the job's packets: it matches them, and no ACCEPT
    before it in its chain takes them all first (one that admits the job's traffic on the
    same ports or on any port: the job's data ports are not known, only its master port)."""
    if not _matches(rule, job):
        return False
    return not any(_matches(a, job) and (a.dports is None or a.dports == rule.dports)
                   and (a.sports is None or a.sports == rule.sports)
                   for a in rule.accepted_before)


def _matches(rule: FilterRule, job: JobTraffic) -> bool:
    if rule.proto not in (None, "all", "tcp", "6"):
        return False
    if rule.family and job.addrs and all(a.version != rule.family for a in job.addrs):
        return False  # an ip6tables rule under an IPv4 job, or the other way round
    if rule.iface is not None and (not job.ifaces
                                   or not _admits(rule.iface, _iface_ok(rule.iface.values,
                                                                        job.ifaces))):
        return False
    for ports in (rule.dports, rule.sports):
        if ports is not None and (not job.ports
                                  or not _admits(ports, _port_ok(ports.values, job.ports))):
            return False
    for addrs in (rule.saddr, rule.daddr):
        if addrs is not None:
            # a negated address admits any job address outside it
            hit = [a for a in job.addrs if _addr_ok(addrs.values, [a])]
            if not (hit if not addrs.negated else len(hit) < len(job.addrs)):
                return False
    return True


def job_ifaces(interfaces: list[dict], env_ifnames: Iterable[str],
               peers: list[IpAddr]) -> set[str]:
    """The interfaces the job's traffic takes: named by ``*_SOCKET_IFNAME`` (``^`` exclusion
    lists skipped, ``=`` exact prefixes stripped), and any holding an address on a peer's
    subnet."""
    out = set()
    for value in env_ifnames:
        for part in value.split(","):
            part = part.strip().lstrip("=")
            if part and not part.startswith("^"):
                out.add(part)
    for entry in interfaces:
        for cidr in entry.get("addresses") or []:
            try:
                net = ipaddress.ip_interface(cidr).network
            except ValueError:
                continue
            if any(p.version == net.version and p in net and not p.is_loopback for p in peers):
                out.add(str(entry.get("name")))
    return out


def addresses(interfaces: list[dict]) -> list[IpAddr]:
    """A node's own non-loopback addresses from host.json's interfaces."""
    out: list[IpAddr] = []
    for entry in interfaces:
        if entry.get("loopback"):
            continue
        for cidr in entry.get("addresses") or []:
            try:
                addr = ipaddress.ip_interface(cidr).ip
            except ValueError:
                continue
            if not addr.is_link_local:
                out.append(addr)
    return out


# -- a job's bundles --------------------------------------------------------------------------
IFNAME_KEYS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "TP_SOCKET_IFNAME")


def _ip(text: object) -> IpAddr | None:
    try:
        return ipaddress.ip_address(str(text).strip("[]"))
    except ValueError:
        return None


def blocking_rules(job: Job) -> dict[str, list[FilterRule]]:
    """``{host: rules}``: each bundle's DROP / REJECT rules that match the job's traffic there
    (its interface, the rendezvous / master port, the other nodes' or its own addresses)."""
    ports: set[int] = set()
    masters: list[IpAddr] = []
    by_host: dict[str, list[IpAddr]] = {}  # each node's own addresses
    for b in job.bundles:
        for p in b.probes:
            if isinstance(p.get("master_port"), int):
                ports.add(p["master_port"])
            masters += [a for a in map(_ip, [p.get("master_addr"), *(p.get("addresses") or [])])
                        if a is not None and not a.is_loopback]
    env = job.env

    def ifnames(host: str) -> list[str]:
        return [] if not env.height else env.filter(
            (env["host"] == host) & env["key"].is_in(list(IFNAME_KEYS)))["value"].to_list()

    for b in job.bundles:
        host = b.manifest.get("host")
        if host:  # the addresses it reaches the master from (all of them when none tells)
            nics = b.host_info.get("interfaces") or []
            mine = job_ifaces(nics, ifnames(host), masters)
            by_host[host] = addresses([n for n in nics if n.get("name") in mine] if mine
                                      else nics)
    if env.height:
        for value in env.filter(env["key"] == "MASTER_PORT")["value"].to_list():
            if str(value).isdigit():
                ports.add(int(value))
    out: dict[str, list[FilterRule]] = {}
    for b in job.bundles:
        host = b.manifest.get("host")
        if not host or not b.firewall:
            continue
        rules = ruleset(b.firewall).rules
        if not rules:
            continue
        peers = list(dict.fromkeys(masters + [a for h, addrs in by_host.items() if h != host
                                              for a in addrs]))
        nics = b.host_info.get("interfaces") or []
        ifaces = job_ifaces(nics, ifnames(host), peers)
        # this node's addresses on the job's interfaces only (not a docker0 bridge's)
        own = addresses([n for n in nics if n.get("name") in ifaces])
        traffic = JobTraffic(ifaces=ifaces, ports=ports, addrs=list(dict.fromkeys(peers + own)))
        hits = [r for r in rules if blocks(r, traffic)]
        if hits:
            out[host] = hits
    return out
