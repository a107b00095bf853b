"""Reports a person reads when a check fails: report.html, plots, JUnit XML, text, a browser.

    write_report(run_dir)         report.html + latency.png + rate.png in the run folder
    write_junit(run_dir, path)    JUnit XML: one test case per checker
    after_run(run_dir, junit)     both, for the runner: never raises, returns one line

Submodules: `data` (what a report shows, read from the run folder alone), `plots`
(matplotlib), `html` (the page), `junit`, `show` (text for terminals), `serve` (the store
browser). A report is derived from a stored run only, never from live state, so
`python -m nemesis report RUN_DIR` regenerates exactly what the run wrote.
"""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger("nemesis.report")

REPORT_NAME = "report.html"


def write_report(run_dir: Path) -> Path:
    """Write report.html and its PNG plots into `run_dir`; returns the report's path."""
    from nemesis.report import html, plots
    from nemesis.report.data import load_run

    run_dir = Path(run_dir)
    data = load_run(run_dir)
    images = plots.render(data)
    for name, png in images.items():
        (run_dir / name).write_bytes(png)
    path = run_dir / REPORT_NAME
    tmp = path.with_suffix(".html.tmp")
    tmp.write_text(html.render(data, images), encoding="utf-8")
    tmp.replace(path)
    return path


def write_junit(run_dir: Path, path: Path) -> Path:
    from nemesis.report.data import load_run
    from nemesis.report.junit import render

    path = Path(path)
    if path.parent != Path(""):
        path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(load_run(Path(run_dir))), encoding="utf-8")
    return path


def after_run(run_dir: Path, junit: Path | None = None) -> str:
    """The runner's hook: write the report (and JUnit XML if asked). A failure here is
    logged with its traceback (harness.log) and reported in one line; it never raises, so
    it can never change a run's exit code."""
    lines = []
    try:
        lines.append(f"report: {write_report(run_dir)}")
    except Exception as exc:
        log.exception("report.html could not be written")
        lines.append(f"report: not written ({type(exc).__name__}: {exc}; traceback in "
                     f"{Path(run_dir) / 'harness.log'})")
    if junit is not None:
        try:
            lines.append(f"junit: {write_junit(run_dir, junit)}")
        except Exception as exc:
            log.exception("JUnit XML could not be written")
            lines.append(f"junit: not written ({type(exc).__name__}: {exc})")
    return "; ".join(lines)
