"""JUnit XML for CI: one test case per checker, so any CI system shows a run as passed or
failed with its reason.

    <testsuites><testsuite name="nemesis.kv">
      <testcase classname="nemesis.kv" name="linearizability"/>              passed
      <testcase ... name="lost writes"><failure message=...>text</failure>   failed
    </testsuite></testsuites>

Test cases are the checkers found in results.json (every entry with `checker` and `valid`,
so a new workload's checkers appear without changes here). A verdict of "unknown" is an
`<error>` (the check could not finish), never a pass; a run the harness could not finish is
one `harness` test case with an `<error>`. The failure text is the counterexample summary.
"""

from __future__ import annotations

import socket
import xml.etree.ElementTree as ET
from typing import Any

from nemesis.report.data import CRASHED, RunData, verdict_sentence

NAMES = {"linearizable": "linearizability", "lost-writes": "lost writes",
         "replicas-agree": "replicas agree", "replays": "replayed requests",
         "stale-read-states": "stale reads of real states", "nodes-stay-up": "nodes stay up",
         "safety-reports": "nodes report no broken rule"}
MAX_FAILURE_CHARS = 20_000


def checkers(results: dict[str, Any]) -> list[dict[str, Any]]:
    return [value for value in results.values()
            if isinstance(value, dict) and "checker" in value and "valid" in value]


def render(data: RunData) -> str:
    workload = (data.test.get("workload") or {}).get("name") or "run"
    classname = f"nemesis.{workload}"
    suite = ET.Element("testsuite", name=classname, hostname=socket.gethostname(),
                       timestamp=str(data.test.get("started", "")))
    properties = ET.SubElement(suite, "properties")
    for name, value in (("run_dir", str(data.run_dir)), ("run_id", data.test.get("run_id")),
                        ("seed", (data.test.get("config") or {}).get("seed")),
                        ("system", data.system[0]), ("system_version", data.system[1]),
                        ("reproduce", data.test.get("reproduce")),
                        ("verdict", data.verdict)):
        if value is not None:
            ET.SubElement(properties, "property", name=name, value=str(value))
    failures = errors = 0
    total_s = 0.0
    cases = checkers(data.results)
    if data.verdict == CRASHED or not cases:
        case = ET.SubElement(suite, "testcase", classname=classname, name="harness", time="0")
        error = ET.SubElement(case, "error", type="harness-error",
                              message=_one_line(verdict_sentence(data)))
        error.text = verdict_sentence(data)
        errors += 1
    for result in cases:
        seconds = float(result.get("seconds") or 0.0)
        total_s += seconds
        name = NAMES.get(result["checker"], result["checker"])
        case = ET.SubElement(suite, "testcase", classname=classname, name=name,
                             time=f"{seconds:.3f}")
        if result["valid"] is True:
            continue
        text = _failure_text(data, result)
        if result["valid"] is False:
            failures += 1
            element = ET.SubElement(case, "failure", type=name, message=_one_line(text))
        else:
            errors += 1
            element = ET.SubElement(case, "error", type="unknown",
                                    message=_one_line(f"unknown: {result.get('note') or text}"))
        element.text = text
    out = ET.SubElement(suite, "system-out")
    out.text = verdict_sentence(data) + f"\nrun folder: {data.run_dir}\nreport: " + str(
        data.run_dir / "report.html")
    tests = len(suite.findall("testcase"))
    suite.set("tests", str(tests))
    suite.set("failures", str(failures))
    suite.set("errors", str(errors))
    suite.set("skipped", "0")
    suite.set("time", f"{total_s:.3f}")
    root = ET.Element("testsuites", name="nemesis", tests=str(tests), failures=str(failures),
                      errors=str(errors), time=f"{total_s:.3f}")
    root.append(suite)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _failure_text(data: RunData, result: dict[str, Any]) -> str:
    lines = [verdict_sentence(data), ""]
    if result["checker"] == "linearizable":
        from nemesis.report.show import counterexample_text

        for violation in data.violations[:3]:
            lines.append(counterexample_text(data, violation))
            lines.append("")
        if len(data.violations) > 3:
            lines.append(f"... {len(data.violations) - 3} more invalid keys in results.json")
    for anomaly in (result.get("anomalies") or [])[:10]:
        lines.append(f"{anomaly.get('kind')}: {anomaly.get('text')}")
    if result.get("note"):
        lines.append(f"note: {result['note']}")
    lines.append(f"report: {data.run_dir / 'report.html'}")
    if data.test.get("reproduce"):
        lines.append(f"reproduce: {data.test['reproduce']}")
    return _xml_safe("\n".join(lines))[:MAX_FAILURE_CHARS]


def _one_line(text: str) -> str:
    first = _xml_safe(text).splitlines()[0] if text else ""
    return first[:300]


def _xml_safe(text: str) -> str:
    """XML 1.0 cannot carry most control characters, even escaped; history values might."""
    return "".join(c if c in "\t\n\r" or (ord(c) >= 0x20 and c not in "\ufffe\uffff") else "?"
                   for c in text)
