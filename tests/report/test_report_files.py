"""A stored run's report, JUnit XML, text view and store browser — without a browser.

The caught canary is a fixture history with a planted stale read (n3, cut off by a
partition, answers a read with the value before the last acknowledged write)."""

from __future__ import annotations

import html
import io
import json
import re
import subprocess
import sys
import tarfile
import urllib.error
import urllib.request
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from nemesis.report import after_run, write_junit
from nemesis.report.data import load_run
from nemesis.report.serve import resolve_inside, serve_in_thread

REPO = Path(__file__).resolve().parents[2]


def _page(run_dir: Path) -> str:
    return (run_dir / "report.html").read_text(encoding="utf-8")


def test_report_of_a_planted_stale_read_shows_the_counterexample(invalid_run: Path) -> None:
    page = _page(invalid_run)
    assert "<h1 class='invalid' id='verdict'>INVALID: on key &#x27;k&#x27;" in page
    assert "answered by n3" in page and "during partition #1 (isolate-node: n1 n2 | n3)" in page
    assert "id='violation'" in page and "Cannot place" in page
    assert "get(&#x27;k&#x27;) -&gt; &#x27;k6&#x27; @v6" in page  # the stale read
    assert "illegal in state &#x27;k7&#x27; @v7" in page  # what the model said
    assert "<svg class='cx'" in page
    # Every link to a history line lands on that line, quoted verbatim on the page.
    lines = (invalid_run / "history.jsonl").read_text().splitlines()
    targets = set(re.findall(r"href='#L(\d+)'", page))
    assert targets
    for target in targets:
        quoted = re.search(rf"<div class='rec' id='L{target}'>.*?</a>(.*?)</div>", page)
        assert quoted, target
        assert json.loads(html.unescape(quoted.group(1))) == json.loads(lines[int(target) - 1])
    records = [json.loads(line) for line in lines]
    stale = next(n for n, r in enumerate(records, 1)
                 if r.get("node") == "n3" and r.get("value") == "k6" and r["index"] > 45)
    assert f"href='#L{stale}'" in page


def test_report_is_self_contained_and_links_every_node_log(invalid_run: Path) -> None:
    page = _page(invalid_run)
    assert not re.search(r"""(src|href)=['"]?(https?:)?//""", page)  # nothing from a network
    assert "<script" not in page
    for node in ("n1", "n2", "n3"):
        assert f"href='nodes/{node}.log'" in page
    for name in ("latency.png", "rate.png"):
        png = (invalid_run / name).read_bytes()
        assert png.startswith(b"\x89PNG") and len(png) > 5000
    assert page.count("src='data:image/png;base64,") == 2
    assert "python -m nemesis run --faults partition" in page  # the reproduce command


def test_valid_and_crashed_runs_say_so_in_one_sentence(valid_run: Path, crashed_run: Path) -> None:
    valid = _page(valid_run)
    assert "<h1 class='valid' id='verdict'>VALID: 29 operations" in valid
    assert "id='violation'" not in valid
    assert "isolate-node: n1 n2 | n3" in valid  # the fault table
    crashed = _page(crashed_run)
    assert "<h1 class='crashed' id='verdict'>CRASHED: the harness did not finish the run " \
           "(no leader within 60 s)" in crashed


def test_fault_windows_and_availability_come_from_the_nemesis_events(valid_run: Path) -> None:
    data = load_run(valid_run)
    assert [(w.fault, w.id, w.nodes) for w in data.windows] == [
        ("partition", 1, ("n1", "n2", "n3")), ("kill", 2, ("n2",))]
    assert all(w.start_s < w.end_s for w in data.windows)
    assert [m.f for m in data.markers] == ["heal-all"]
    inside_ok, inside = data.availability()["inside faults"]
    assert (inside_ok, inside) == (2, 4)  # put ok, failed read on n3, info put, read on n1
    assert data.counts_by("node")["n3"] == {"ok": 4, "fail": 1, "info": 0}
    assert data.counts_by("f")["put"]["info"] == 1


def _junit(path: Path) -> ET.Element:
    root = ET.parse(path).getroot()  # parses: well-formed
    assert root.tag == "testsuites"
    suite = root.find("testsuite")
    assert suite is not None
    cases = suite.findall("testcase")
    assert int(suite.get("tests")) == len(cases) == int(root.get("tests"))
    assert int(suite.get("failures")) == sum(c.find("failure") is not None for c in cases)
    assert int(suite.get("errors")) == sum(c.find("error") is not None for c in cases)
    return suite


def test_junit_has_one_case_per_checker_and_the_counterexample_as_failure_text(
        invalid_run: Path, valid_run: Path, crashed_run: Path, tmp_path: Path) -> None:
    suite = _junit(write_junit(invalid_run, tmp_path / "invalid.xml"))
    cases = {c.get("name"): c for c in suite.findall("testcase")}
    # (the replicas-agree, replay, stale-state and crash cases are there for every kv run;
    # this history has no replica reads, replays, stale reads or crashes, so they pass:
    # docs/checker.md)
    assert set(cases) == {"linearizability", "lost writes", "replicas agree",
                          "replayed requests", "stale reads of real states", "nodes stay up",
                          "nodes report no broken rule"}
    for passing in ("replicas agree", "replayed requests", "stale reads of real states",
                    "nodes stay up", "nodes report no broken rule"):
        assert cases[passing].find("failure") is None
    failure = cases["linearizability"].find("failure")
    assert failure is not None and "cannot place: get('k') -> 'k6' @v6" in failure.text
    assert failure.get("message").startswith("INVALID: on key 'k'")
    assert "stale-read" in cases["lost writes"].find("failure").text  # the missed write is read later
    props = {p.get("name"): p.get("value") for p in suite.find("properties")}
    assert props["seed"] == "7" and props["verdict"] == "invalid"

    suite = _junit(write_junit(valid_run, tmp_path / "valid.xml"))
    assert suite.get("failures") == "0" and suite.get("errors") == "0"
    suite = _junit(write_junit(crashed_run, tmp_path / "crashed.xml"))
    assert [c.get("name") for c in suite.findall("testcase")] == ["harness"]
    assert "no leader within 60 s" in suite.find("testcase/error").text


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nemesis", *args], cwd=cwd, text=True,
                          capture_output=True, timeout=60,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})


def test_report_and_show_commands_regenerate_from_the_stored_run(invalid_run: Path,
                                                                  tmp_path: Path) -> None:
    (invalid_run / "report.html").unlink()
    done = _cli("report", str(invalid_run), "--junit", str(tmp_path / "j.xml"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (invalid_run / "report.html").exists() and (tmp_path / "j.xml").exists()
    shown = _cli("show", str(invalid_run), "--key", "k", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("INVALID: on key 'k'")
    assert "✗ get('k') -> 'k6' @v6" in shown.stdout and "[##]" in shown.stdout
    assert "isolate-node: n1 n2 | n3" in shown.stdout
    missing = _cli("show", str(tmp_path / "nothing"), cwd=tmp_path)
    assert missing.returncode == 3 and "is not a run folder" in missing.stderr


def test_a_report_failure_never_raises_out_of_the_runner_hook(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              caplog: pytest.LogCaptureFixture
                                                              ) -> None:
    import nemesis.report as report

    def broken(run_dir: Path) -> Path:
        raise RuntimeError("plot exploded")

    monkeypatch.setattr(report, "write_report", broken)
    line = after_run(tmp_path, None)
    assert line.startswith("report: not written (RuntimeError: plot exploded")
    assert "report.html could not be written" in caplog.text


# --- the store browser ----------------------------------------------------------------------

@pytest.fixture()
def server(report_store: Path):  # noqa: ANN201
    server, thread = serve_in_thread(report_store)
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - loopback
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_index_lists_runs_newest_first_with_their_verdicts(server: str) -> None:
    status, body = _get(server + "/")
    assert status == 200
    page = body.decode()
    verdicts = re.findall(r"<td class='verdict'[^>]*>(\w+)</td>", page)
    assert verdicts == ["crashed", "invalid", "valid"]
    assert "canary stale-read" in page
    assert "/runs/kv/20260101T000002/report.html" in page
    status, report = _get(server + "/runs/kv/20260101T000002/report.html")
    assert status == 200 and b"INVALID: on key" in report
    status, log = _get(server + "/runs/kv/20260101T000002/nodes/n3.log")
    assert status == 200 and b'"node": "n3"' in log
    status, listing = _get(server + "/runs/kv/20260101T000002/")
    assert status == 200 and b"history.jsonl" in listing


def test_archive_download_holds_the_run_folder(server: str) -> None:
    status, body = _get(server + "/archive/kv/20260101T000002.tar.gz")
    assert status == 200
    with tarfile.open(fileobj=io.BytesIO(body), mode="r:gz") as archive:
        names = set(archive.getnames())
    assert {"20260101T000002/history.jsonl", "20260101T000002/report.html",
            "20260101T000002/nodes/n1.log"} <= names


@pytest.mark.parametrize("path", [
    "/runs/../secret.txt", "/runs/%2e%2e/secret.txt", "/runs/%2E%2E/secret.txt",
    "/runs/kv/..%2f..%2fsecret.txt", "/runs/kv%2f..%2f..%2fsecret.txt",
    "/runs/..%5csecret.txt", "/runs/kv/%2e%2e/%2e%2e/secret.txt", "/runs/%252e%252e/secret.txt",
    "/runs/outside/secret.txt", "/runs/%00/secret.txt", "/runs/%ff%fe",
    "/archive/...tar.gz", "/archive/%2e%2e.tar.gz", "/archive/..%2f..%2fetc.tar.gz",
    "/runs//etc/passwd", "/runs/kv/../../../../etc/passwd",
])
def test_a_path_outside_the_store_is_refused(server: str, report_store: Path, path: str) -> None:
    (report_store.parent / "secret.txt").write_text("SECRET")
    outside = report_store / "outside"
    if not outside.exists():
        outside.symlink_to(report_store.parent, target_is_directory=True)
    # Raw request line: urllib would normalise the dots away before sending.
    import http.client

    host, port = server.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    connection.putrequest("GET", path, skip_host=False)
    connection.endheaders()
    response = connection.getresponse()
    body = response.read()
    connection.close()
    assert response.status in (400, 403, 404), (path, response.status)
    assert b"SECRET" not in body and b"root:" not in body


def test_resolve_inside_keeps_paths_in_the_store(tmp_path: Path) -> None:
    store = tmp_path / "store"
    (store / "kv" / "r1").mkdir(parents=True)
    assert resolve_inside(store, "kv/r1") == (store / "kv" / "r1").resolve()
    assert resolve_inside(store, "kv/%72%31") == (store / "kv" / "r1").resolve()
    for bad in ("..", "kv/../..", "%2e%2e", "kv%2f%2e%2e%2f%2e%2e", "a\\..\\..", "x%00"):
        assert resolve_inside(store, bad) is None, bad


def test_serve_binds_to_loopback_by_default(tmp_path: Path) -> None:
    from nemesis.report.serve import make_server

    server = make_server(tmp_path, port=0)
    try:
        assert server.server_address[0] == "127.0.0.1"
    finally:
        server.server_close()
