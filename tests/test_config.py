"""Configuration (``[tool.ddp-autopsy]`` / ``ddp-autopsy.toml``) and rule plugins (entry points
``ddp_autopsy.rules``), the plugin installed for real from a throw-away package into a venv."""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import textwrap
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner

from ddp_autopsy.cli import main

CASE = Path(__file__).parent / "rules" / "cases" / "NCCL006-gloo-hosts-alias"
SCHEMAS = Path(__file__).parents[1] / "ddp_autopsy" / "schemas"


def _analyze(*args: str) -> tuple[int, dict | str]:
    res = CliRunner().invoke(main, ["analyze", str(CASE), "--format", "json", *args])
    try:
        return res.exit_code, json.loads(res.stdout)
    except ValueError:
        return res.exit_code, res.output


def test_no_config_runs_every_rule(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, doc = _analyze()
    assert code == 0 and isinstance(doc, dict)
    assert doc["verdict"]["rule"] == "NCCL006"
    assert {o["rule"] for o in doc["rules"]} >= {"NCCL006", "CRASH001", "RDZV001"}


def test_pyproject_select_ignore_severity(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "pyproject.toml").write_text(textwrap.dedent("""
        [project]
        name = "somebody"

        [tool.ddp-autopsy]
        select = ["NCCL", "CRASH001", "rank-crashed"]
        ignore = ["NCCL006"]
        severity = {CRASH001 = "critical", "rank-crashed" = "critical"}
    """))
    sub = tmp_path / "a" / "b"
    sub.mkdir(parents=True)
    monkeypatch.chdir(sub)  # found from a subdirectory, as ruff's
    code, doc = _analyze()
    assert code == 0 and isinstance(doc, dict), doc
    ran = {o["rule"] for o in doc["rules"]}
    assert ran and all(r.startswith("NCCL") or r == "CRASH001" for r in ran)
    assert "NCCL006" not in ran
    crash = next(f for f in doc["findings"] if f["rule"] == "CRASH001")
    assert crash["severity"] == "critical"
    assert doc["verdict"]["rule"] == "CRASH001"  # NCCL006 ignored: the crash is the cause
    # The override counts for --fail-on as for every output.
    assert _analyze("--fail-on", "error")[0] == 1


def test_own_file_wins_and_config_option(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "pyproject.toml").write_text('[tool.ddp-autopsy]\nignore = ["CRASH"]\n')
    (tmp_path / "ddp-autopsy.toml").write_text('ignore = ["NCCL006"]\n')
    monkeypatch.chdir(tmp_path)
    _, doc = _analyze()
    ran = {o["rule"] for o in doc["rules"]}
    assert "NCCL006" not in ran and "CRASH001" in ran
    other = tmp_path / "other.toml"
    other.write_text('select = ["NCCL006"]\n')
    _, doc = _analyze("--config", str(other))
    assert [o["rule"] for o in doc["rules"]] == ["NCCL006"]


@pytest.mark.parametrize("text,words", [
    ('[tool.ddp-autopsy]\nignor = ["X"]\n', "did you mean 'ignore'"),
    ('[tool.ddp-autopsy]\nselect = ["RDZV09"]\n', "did you mean RDZV"),
    ('[tool.ddp-autopsy]\nselect = "RDZV001"\n', "must be a list"),
    ('[tool.ddp-autopsy]\nseverity = {RDZV001 = "fatal"}\n', "not one of"),
    ('[tool.ddp-autopsy]\nselect = ["RDZV001"]\nignore = ["RDZV"]\n', "leave no rule"),
    ('[tool.ddp-autopsy\n', "not valid TOML"),
])
def test_bad_config_is_a_usage_error(text: str, words: str, tmp_path: Path,
                                     monkeypatch) -> None:
    cfg = tmp_path / "pyproject.toml"
    cfg.write_text(text)
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(main, ["analyze", str(CASE), "--config", str(cfg)])
    assert res.exit_code == 2, res.output
    assert words in res.output and "Traceback" not in res.output
    if "not valid" not in words:  # found by itself too
        assert CliRunner().invoke(main, ["analyze", str(CASE)]).exit_code == 2


def test_python_api_reads_the_config(tmp_path: Path) -> None:
    (tmp_path / "ddp-autopsy.toml").write_text('ignore = ["NCCL006"]\n')
    code = ("import json, sys, ddp_autopsy; a = ddp_autopsy.analyze(sys.argv[1]); "
            "b = ddp_autopsy.analyze(sys.argv[1], config=False); "
            "print(json.dumps([a.verdict.rule, b.verdict.rule]))")
    out = subprocess.run([sys.executable, "-c", code, str(CASE)], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == ["CRASH001", "NCCL006"]


PLUGIN_RULE = '''
"""Disk quota exceeded on a rank's last line.

## What it detects
A rank whose last log line says the disk quota is exceeded.

## Why it hangs or kills the job
The rank cannot write its checkpoint and stops; the others wait for it.

## Evidence
The rank's last line.

## Remedy
Free space on the checkpoint volume.

## Example
```
[rank1]: OSError: [Errno 122] Disk quota exceeded
```
"""
from ddp_autopsy.rules.base import Evidence, Rule


class QuotaExceeded(Rule):
    code = "ACME001"
    slug = "disk-quota-exceeded"
    role = "info"
    severity = "warning"
    requires = ("rank_state",)

    def check(self, job):
        for row in job.rank_state.iter_rows(named=True):
            if "Disk quota exceeded" in (row["last_line"] or ""):
                yield self.finding(
                    f"Rank {row['rank']} ran out of disk quota.",
                    evidence=[Evidence(row["last_source"] or "?", None, row["last_line"],
                                       row["rank"])],
                    ranks=[row["rank"]])
'''


PLUGIN_PATTERNS = r'''
PATTERNS = {"ckpt-write": {"regex": r"CKPT WRITE FAILED on (?P<path>\S+)",
                           "kind": "checkpoint_write_failed", "severity": "error"}}
BAD = {"broken": {"regex": "loss (nan", "kind": "nan_loss"}}
'''


def _plugin_package(root: Path) -> Path:
    pkg = root / "acme-autopsy-rules"
    (pkg / "acme_autopsy_rules").mkdir(parents=True)
    (pkg / "acme_autopsy_rules" / "__init__.py").write_text("")
    (pkg / "acme_autopsy_rules" / "quota.py").write_text(PLUGIN_RULE)
    (pkg / "acme_autopsy_rules" / "broken.py").write_text("raise ImportError('boom')\n")
    (pkg / "acme_autopsy_rules" / "patterns.py").write_text(PLUGIN_PATTERNS)
    (pkg / "pyproject.toml").write_text(textwrap.dedent("""
        [build-system]
        requires = ["setuptools>=61"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "acme-autopsy-rules"
        version = "0.1"

        [project.entry-points."ddp_autopsy.rules"]
        quota = "acme_autopsy_rules.quota:QuotaExceeded"
        broken = "acme_autopsy_rules.broken"
        zz_clash = "acme_autopsy_rules.quota"

        [project.entry-points."ddp_autopsy.patterns"]
        acme = "acme_autopsy_rules.patterns:PATTERNS"
        bad = "acme_autopsy_rules.patterns:BAD"
    """))
    return pkg


def test_plugin_rule_from_an_installed_package(tmp_path: Path) -> None:
    """A throw-away package declaring a rule under the ``ddp_autopsy.rules`` entry point,
    pip-installed into a fresh venv that sees this environment: ``rules`` lists it,
    ``analyze`` runs it like a built-in, a broken plugin is reported and skipped."""
    venv = tmp_path / "venv"
    # --without-pip: pip (and setuptools) come from this environment, not ensurepip's old ones.
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip",
                    str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    # --system-site-packages sees the base interpreter's packages; this environment's (where
    # ddp-autopsy is installed, editable or not) is added with a .pth, as a site dir.
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()"
                              "['purelib'])"], capture_output=True, text=True, check=True)
    ours = [p for p in site.getsitepackages() if Path(p).is_dir()]
    Path(purelib.stdout.strip(), "zz_ddp_autopsy_env.pth").write_text(
        "import site; " + "; ".join(f"site.addsitedir({p!r})" for p in ours) + "\n")
    pkg = _plugin_package(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps",
                    "--no-build-isolation", "--no-index", str(pkg)],
                   check=True, timeout=300, env=env, cwd=tmp_path)
    cli = [str(py), "-c", "import sys; from ddp_autopsy.cli import main; "
                          "main(sys.argv[1:], prog_name='ddp-autopsy')"]
    listing = subprocess.run([*cli, "rules"], capture_output=True, text=True, timeout=120,
                             env=env, cwd=tmp_path)
    assert listing.returncode == 0, listing.stderr
    assert "ACME001" in listing.stdout and "plugin: acme_autopsy_rules" in listing.stdout
    assert "broken = acme_autopsy_rules.broken not loaded: ImportError: boom" in listing.stderr
    assert "1 log pattern(s) from plugins: `ddp-autopsy patterns` lists them" in listing.stderr
    assert "zz_clash = acme_autopsy_rules.quota not loaded: ACME001 disk-quota-exceeded is taken" \
        in listing.stderr  # entry points load in name order: the first one wins
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "rank1.log").write_text("[rank1]: step 3\n[rank1]: OSError: [Errno 122] Disk "
                                    "quota exceeded\n")
    (logs / "rank0.log").write_text("[rank0]: step 3\n")
    res = subprocess.run([*cli, "analyze", str(logs), "--format", "json"], capture_output=True,
                         text=True, timeout=120, env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    mine = [f for f in doc["findings"] if f["rule"] == "ACME001"]
    assert mine and mine[0]["ranks"] == [1], doc["findings"]
    assert {"rule": "ACME001", "slug": "disk-quota-exceeded", "status": "finding"}.items() <= \
        next(o for o in doc["rules"] if o["rule"] == "ACME001").items()
    # The config selects plugin rules like built-ins.
    (tmp_path / "ddp-autopsy.toml").write_text('ignore = ["ACME"]\n')
    res = subprocess.run([*cli, "analyze", str(logs), "--format", "json"], capture_output=True,
                         text=True, timeout=120, env=env, cwd=tmp_path)
    assert "ACME001" not in {o["rule"] for o in json.loads(res.stdout)["rules"]}
    # And this environment, without the package, knows nothing of it.
    assert "ACME001" not in CliRunner().invoke(main, ["rules"]).output

    # Log patterns from the same package (entry points ddp_autopsy.patterns): listed, read by
    # the analysis like the built-in ones; the broken one is reported and left out.
    (tmp_path / "ddp-autopsy.toml").unlink()
    listing = subprocess.run([*cli, "patterns", "--format", "json"], capture_output=True,
                             text=True, timeout=120, env=env, cwd=tmp_path)
    assert listing.returncode == 0, listing.stderr
    doc = json.loads(listing.stdout)
    jsonschema.validate(doc, json.loads((SCHEMAS / "patterns.schema.json").read_text()))
    assert [(p["name"], p["kind"], p["source"]) for p in doc["patterns"]] == [
        ("acme.ckpt-write", "checkpoint_write_failed", "plugin acme-autopsy-rules")]
    assert "pattern plugin bad = acme_autopsy_rules.patterns:BAD not loaded" in listing.stderr
    assert "missing ), unterminated subpattern" in listing.stderr
    other = tmp_path / "logs2"
    other.mkdir()
    (other / "rank2.log").write_text("[rank2]: step 9\n[rank2]: CKPT WRITE FAILED on /ckpt/9\n")
    (other / "rank0.log").write_text("[rank0]: step 9\n")
    res = subprocess.run([*cli, "analyze", str(other), "--format", "json"], capture_output=True,
                         text=True, timeout=120, env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    verdict = json.loads(res.stdout)["verdict"]
    assert verdict["rule"] == "CRASH004" and verdict["ranks"] == [2], verdict
    assert "CKPT WRITE FAILED on /ckpt/9" in verdict["summary"]
    # Without the package the same line is nothing.
    res = CliRunner().invoke(main, ["analyze", str(other), "--format", "json"])
    assert json.loads(res.stdout)["verdict"] is None


# --- extra log patterns --------------------------------------------------------------------------

PATTERN_CONFIG = r"""
[tool.ddp-autopsy.patterns.ckpt-write]
regex = 'CKPT WRITE FAILED on (?P<path>\S+)'
kind = "checkpoint_write_failed"

[tool.ddp-autopsy.patterns.launcher-port]
regex = 'could not bind port (?P<port>\d+), it is taken'
kind = "port_in_use"
"""


def _logs(root: Path) -> Path:
    logs = root / "logs"
    logs.mkdir()
    (logs / "rank0.log").write_text("[rank0]: step 9\n")
    (logs / "rank3.log").write_text("[rank3]: step 9\n[rank3]: CKPT WRITE FAILED on /ckpt/9\n")
    (logs / "launcher.log").write_text("ERROR acme launcher could not bind port 29611, it is "
                                       "taken\n")
    return logs


def test_configured_patterns_are_read_like_the_built_in_ones(tmp_path: Path,
                                                            monkeypatch) -> None:
    """A new kind (a failure by default: the earliest one is the fallback verdict) and a new
    wording of a built-in kind (port_in_use: RDZV001 fires, with the port it names)."""
    from ddp_autopsy.analyzer.patterns import catalog_hash

    (tmp_path / "pyproject.toml").write_text(PATTERN_CONFIG)
    logs = _logs(tmp_path)
    monkeypatch.chdir(tmp_path)
    builtin = catalog_hash()
    res = CliRunner().invoke(main, ["analyze", str(logs / "rank3.log"), str(logs / "rank0.log"),
                                    "--format", "json"])
    assert catalog_hash() == builtin  # in use for the analysis only
    assert res.exit_code == 0, res.output
    verdict = json.loads(res.stdout)["verdict"]
    assert verdict["rule"] == "CRASH004" and verdict["ranks"] == [3], verdict
    res = CliRunner().invoke(main, ["analyze", str(logs / "launcher.log"), "--format", "json"])
    verdict = json.loads(res.stdout)["verdict"]
    assert verdict["rule"] == "RDZV001" and "sport = :29611" in verdict["remedy"], verdict
    listing = CliRunner().invoke(main, ["patterns", "--format", "json"])
    doc = json.loads(listing.stdout)
    jsonschema.validate(doc, json.loads((SCHEMAS / "patterns.schema.json").read_text()))
    assert [(p["name"], p["kind"], p["severity"], p["needles"]) for p in doc["patterns"]] == [
        ("ckpt-write", "checkpoint_write_failed", "error", ["CKPT WRITE FAILED on "]),
        ("launcher-port", "port_in_use", None, ["could not bind port "])]
    text = CliRunner().invoke(main, ["patterns"]).output
    assert "launcher-port" in text and "(built-in kind)" in text


def test_patterns_are_in_use_for_their_analysis_only(tmp_path: Path) -> None:
    """In one process (the Python API), an analysis without the configuration does not see
    the previous one's patterns; while they are in use, the catalog hash (which tells whether
    collect's summaries are current) includes them."""
    cfg = tmp_path / "pyproject.toml"
    cfg.write_text(PATTERN_CONFIG)
    logs = _logs(tmp_path)
    code = ("import json, sys, ddp_autopsy; from pathlib import Path; "
            "from ddp_autopsy import config; from ddp_autopsy.analyzer.patterns import "
            "catalog_hash; h0 = catalog_hash(); "
            "a = ddp_autopsy.analyze(sys.argv[1], config=sys.argv[2]); h1 = catalog_hash(); "
            "b = ddp_autopsy.analyze(sys.argv[1], config=False); "
            "conf = config.load(Path(sys.argv[2])); cm = conf.installed(); cm.__enter__(); "
            "h2 = catalog_hash(); cm.__exit__(None, None, None); "
            "print(json.dumps([a.verdict and a.verdict.rule, b.verdict and b.verdict.rule, "
            "h0 == h1, h0 != h2, h0 == catalog_hash()]))")
    out = subprocess.run([sys.executable, "-c", code, str(logs / "launcher.log"), str(cfg)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == ["RDZV001", None, True, True, True]


@pytest.mark.parametrize("table,words", [
    ("regex = 'loss (nan'\nkind = 'nan_loss'", "not a valid regex: missing ), unterminated"),
    ("regex = 'loss nan'\nkind = 'NaN loss'", "kind: an event kind is needed"),
    ("regex = 'loss nan'\nkind = 'port_in_use'\nseverity = 'error'", "is a built-in kind"),
    ("regex = 'loss nan'\nkind = 'nan_loss'\nseverity = 'fatal'", "'fatal' is not one of"),
    ("regx = 'loss nan'\nkind = 'nan_loss'", "did you mean 'regex'"),
    ("regex = '(?i)loss nan'\nkind = 'nan_loss'", "give needles"),
    ("regex = 'loss (nan|inf)'\nkind = 'nan_loss'\nneedles = 'loss'", "needles must be a list"),
    ("kind = 'nan_loss'", "regex: a regular expression"),
    ("regex = 'loss nan'\nkind = 'nan_loss'\n[tool.ddp-autopsy.patterns.nan2]\n"
     "regex = 'loss inf'\nkind = 'nan_loss'\nseverity = 'info'", "nan_loss is 'error' in"),
])
def test_bad_patterns_are_usage_errors(table: str, words: str, tmp_path: Path,
                                       monkeypatch) -> None:
    (tmp_path / "pyproject.toml").write_text(f"[tool.ddp-autopsy.patterns.nan]\n{table}\n")
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(main, ["analyze", str(CASE)])
    assert res.exit_code == 2, res.output
    assert "patterns.nan" in res.output and words in res.output, res.output
    assert "Traceback" not in res.output
    assert CliRunner().invoke(main, ["patterns"]).exit_code == 2


def test_needles_given_for_an_alternation(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "ddp-autopsy.toml").write_text(
        "[patterns.nan]\nregex = 'loss (nan|inf) at step (?P<step>\\d+)'\nkind = 'nan_loss'\n"
        "severity = 'warning'\n"
        "[patterns.any]\nregex = '(?:diverged|exploded)'\nkind = 'nan_loss'\n"
        "needles = ['diverged', 'exploded']\nseverity = 'warning'\n")
    monkeypatch.chdir(tmp_path)
    doc = json.loads(CliRunner().invoke(main, ["patterns", "--format", "json"]).stdout)
    assert [p["needles"] for p in doc["patterns"]] == [[" at step "], ["diverged", "exploded"]]
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "r1.log").write_text("[rank1]: loss nan at step 7\n")
    res = CliRunner().invoke(main, ["analyze", str(logs), "--format", "json"])
    # a warning kind is context, never a failure: no verdict
    assert json.loads(res.stdout)["verdict"] is None
