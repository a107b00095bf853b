"""`nemesis serve` beyond loopback: nothing from the store without the token (issue 24).

The servers here bind 0.0.0.0 (every interface, the case that needs the token) and are
reached at 127.0.0.1; each holds a token, so nothing is open to the network meanwhile.
"""

from __future__ import annotations

import http.client
import os
import re
import selectors
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nemesis.report.serve import TokenRequired, is_loopback, make_server, serve_in_thread

TOKEN = "t0ken-for-the-tests_0123456789"
LOG = "/runs/kv/20260101T000002/nodes/n3.log"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def guarded(report_store: Path):  # noqa: ANN201
    server, thread = serve_in_thread(report_store, host="0.0.0.0", token=TOKEN)  # noqa: S104
    yield server.server_address[1]
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def _get(port: int, path: str, headers: dict[str, str] | None = None
         ) -> tuple[int, dict[str, str], bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", path, headers=headers or {})
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


def test_beyond_loopback_the_server_is_not_made_without_a_token(tmp_path: Path) -> None:
    for host in ("0.0.0.0", "::", "192.0.2.7", "example.org"):  # noqa: S104
        assert not is_loopback(host), host
    with pytest.raises(TokenRequired, match="needs a token"):
        make_server(tmp_path, host="0.0.0.0", port=0)  # noqa: S104
    with pytest.raises(TokenRequired, match="at least 16"):
        make_server(tmp_path, host="0.0.0.0", port=0, token="short")  # noqa: S104
    for host in ("127.0.0.1", "localhost", "::1", "127.0.0.2"):
        assert is_loopback(host), host


@pytest.mark.parametrize("path", ["/", LOG, "/runs/kv/20260101T000002/",
                                  "/archive/kv/20260101T000002.tar.gz", "/favicon.ico",
                                  "/no-such-page"])
@pytest.mark.parametrize("credential", [
    {}, {"Authorization": "Bearer wrong-token-0123456789"}, {"Authorization": f"Basic {TOKEN}"},
    {"Cookie": "nemesis_token_PORT=wrong-token-0123456789"}, {"Cookie": f"other={TOKEN}"},
    "?token=wrong-token-0123456789", f"?token={TOKEN[:-1]}", "?token=",
], ids=["none", "wrong-bearer", "basic", "wrong-cookie", "other-cookie", "wrong-query",
        "prefix-query", "empty-query"])
def test_without_the_token_nothing_is_served(guarded: int, path: str,
                                             credential: dict[str, str] | str) -> None:
    headers = {}
    if isinstance(credential, str):
        path += credential
    else:
        headers = {k: v.replace("PORT", str(guarded)) for k, v in credential.items()}
    status, response_headers, body = _get(guarded, path, headers)
    assert status == 401, (path, credential, status)
    assert "Set-Cookie" not in response_headers
    assert response_headers.get("WWW-Authenticate", "").startswith("Bearer")
    text = body.decode()
    assert text.count("\n") == 1 and "token" in text and "Authorization: Bearer" in text
    assert "n3" not in text and "verdict" not in text


def test_the_token_in_the_address_once_becomes_a_strict_http_only_cookie(guarded: int) -> None:
    status, headers, _ = _get(guarded, f"/runs/kv/20260101T000002/?token={TOKEN}")
    assert status == 303
    assert headers["Location"] == "/runs/kv/20260101T000002/"  # the token leaves the URL
    cookie = headers["Set-Cookie"]
    assert cookie.startswith(f"nemesis_token_{guarded}={TOKEN};")
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    status, _, body = _get(guarded, "/", {"Cookie": cookie.split(";")[0]})
    assert status == 200 and b"canary stale-read" in body
    status, _, body = _get(guarded, LOG, {"Cookie": "a=b; " + cookie.split(";")[0]})
    assert status == 200 and b'"node": "n3"' in body


def test_a_bearer_header_is_enough(guarded: int) -> None:
    status, _, body = _get(guarded, LOG, {"Authorization": f"Bearer {TOKEN}"})
    assert status == 200 and b'"node": "n3"' in body
    status, _, body = _get(guarded, "/runs/%2e%2e/secret.txt", {"Authorization": f"Bearer {TOKEN}"})
    assert status in (403, 404)  # the token opens the store, not what is outside it


def test_on_loopback_a_given_token_is_checked_too(report_store: Path) -> None:
    server, thread = serve_in_thread(report_store, token=TOKEN)
    try:
        port = server.server_address[1]
        assert _get(port, "/")[0] == 401
        assert _get(port, "/", {"Authorization": f"Bearer {TOKEN}"})[0] == 200
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def _serve_cli(store: Path, *flags: str, env: dict[str, str] | None = None
               ) -> tuple[subprocess.Popen, list[str]]:
    """`python -m nemesis serve` started, and the lines it printed before serving."""
    process = subprocess.Popen(
        [sys.executable, "-m", "nemesis", "serve", "--store", str(store), "--port", "0", *flags],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, **(env or {})})
    lines: list[str] = []
    selector = selectors.DefaultSelector()
    selector.register(process.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not any("serving" in line for line in lines):
        if selector.select(timeout=deadline - time.monotonic()):
            line = process.stdout.readline()
            if not line:
                break
            lines.append(line)
    selector.close()
    if any("?token=" in line for line in lines):  # printed, flushed, right after the address
        lines.append(process.stdout.readline())
    return process, lines


def _stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)
    process.stdout.close()


def test_serve_beyond_loopback_prints_a_drawn_token_and_requires_it(report_store: Path) -> None:
    process, lines = _serve_cli(report_store, "--host", "0.0.0.0")  # noqa: S104
    try:
        found = re.search(r"http://0\.0\.0\.0:(\d+)/\?token=([A-Za-z0-9_-]{40,})", "".join(lines))
        assert found, lines
        port, token = int(found[1]), found[2]
        assert f"Authorization: Bearer {token}" in lines[-1]
        assert _get(port, "/")[0] == 401
        assert _get(port, "/", {"Authorization": f"Bearer {token}"})[0] == 200
    finally:
        _stop(process)


def test_serve_takes_the_token_from_the_environment(report_store: Path) -> None:
    process, lines = _serve_cli(report_store, "--host", "0.0.0.0",  # noqa: S104
                                env={"NEMESIS_SERVE_TOKEN": TOKEN})
    try:
        found = re.search(r":(\d+)/\?token=(\S+) ", "".join(lines))
        assert found and found[2] == TOKEN, lines
        assert _get(int(found[1]), LOG)[0] == 401
        assert _get(int(found[1]), LOG, {"Authorization": f"Bearer {TOKEN}"})[0] == 200
    finally:
        _stop(process)


def test_serve_refuses_a_short_token_in_one_line(report_store: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "nemesis", "serve", "--store", str(report_store), "--port", "0",
         "--host", "0.0.0.0", "--token", "abc"],  # noqa: S104
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 3
    assert result.stderr.count("\n") == 1 and "at least 16" in result.stderr
