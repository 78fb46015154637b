"""Regenerate the report screenshots of docs/report.md from three real jobs.

    python scripts/screenshots.py [--out docs/img] [--runs DIR] [--keep DIR]

Runs three scenarios of the library (tests/scenarios: real torchrun jobs on CPU): a hang
(``stuck_in_eval``: rank 0 in evaluate, collected with ``collect``), a crash
(``rank_crash_exception``: torchrun's console) and a start-up failure (``port_in_use``), writes
each one's HTML post-mortem with ``ddp-autopsy report`` and photographs it in headless Chromium
(Playwright driving Debian's ``/usr/bin/chromium``, or ``DDP_AUTOPSY_CHROMIUM``): the first
screen at 1400 px and at 390 px (a phone), and the first printed A4 page (print media at the
page's printable width, 711 px). ``--runs DIR`` reuses runs already in DIR/<scenario> (as
``tests/scenarios/runner.py --out DIR`` leaves them); ``--keep DIR`` keeps the HTML reports.
Each PNG must stay under 200 KB (the script fails otherwise). Needs torch (the jobs) and
playwright; about a minute on 2 cores.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("DDP_AUTOPSY_CHROMIUM", "/usr/bin/chromium")
MAX_BYTES = 200_000
#: (name in docs, scenario, the report's inputs relative to the scenario's run directory)
REPORTS = (
    ("hang", "stuck_in_eval", ("bundle", "console.log")),
    ("crash", "rank_crash_exception", ("console.log",)),
    ("startup", "port_in_use", ("console.log",)),
)
#: (suffix, viewport width, viewport height, media)
SHOTS = (("1400", 1400, 860, "screen"), ("390", 390, 844, "screen"),
         ("print", 711, 1032, "print"))


def run_scenarios(names: list[str], workdir: Path) -> None:
    sys.path.insert(0, str(ROOT / "tests"))
    from scenarios.runner import run_scenario

    for name in names:
        run = run_scenario(name, workdir)
        if run.skipped or run.error:
            raise SystemExit(f"scenario {name}: {run.skipped or run.error}")
        print(f"ran {name} in {run.duration_s:.1f} s")


def write_reports(runs: Path, out: Path) -> dict[str, Path]:
    """Each report written from inside ``runs`` so that its paths read ``<scenario>/...``."""
    reports = {}
    for doc_name, scenario, inputs in REPORTS:
        html = out / f"{doc_name}.html"
        cmd = [sys.executable, "-m", "ddp_autopsy", "report",
               *[f"{scenario}/{i}" for i in inputs], "-o", str(html.resolve())]
        subprocess.run(cmd, cwd=runs, check=True, stdout=subprocess.DEVNULL)
        reports[doc_name] = html
    return reports


def photograph(reports: dict[str, Path], out: Path) -> list[Path]:
    from playwright.sync_api import sync_playwright

    written = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM,
                                    args=["--headless", "--no-sandbox", "--disable-gpu"])
        for doc_name, html in reports.items():
            for suffix, width, height, media in SHOTS:
                ctx = browser.new_context(viewport={"width": width, "height": height},
                                          color_scheme="light")
                page = ctx.new_page()
                page.goto(html.resolve().as_uri(), wait_until="load")
                page.emulate_media(media=media)  # type: ignore[arg-type]
                png = out / f"report-{doc_name}-{suffix}.png"
                page.screenshot(path=str(png))
                written.append(png)
                ctx.close()
        browser.close()
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "img")
    ap.add_argument("--runs", type=Path, help="reuse scenario runs in DIR/<scenario>")
    ap.add_argument("--keep", type=Path, help="keep the HTML reports in DIR")
    args = ap.parse_args(argv)
    if not Path(CHROMIUM).is_file():
        print(f"no Chromium at {CHROMIUM} (apt-get install chromium)", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ddp-autopsy-shots-") as tmp:
        runs = args.runs or Path(tmp) / "runs"
        if args.runs is None:
            run_scenarios([s for _, s, _ in REPORTS], runs)
        html_dir = args.keep or Path(tmp) / "html"
        html_dir.mkdir(parents=True, exist_ok=True)
        reports = write_reports(runs, html_dir)
        written = photograph(reports, args.out)
    too_big = []
    for png in written:
        size = png.stat().st_size
        print(f"{png.relative_to(ROOT) if png.is_relative_to(ROOT) else png}: {size:,} bytes")
        if size > MAX_BYTES:
            too_big.append(png.name)
    if too_big:
        print(f"over {MAX_BYTES:,} bytes: {', '.join(too_big)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
