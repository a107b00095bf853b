"""`python -m nemesis serve [--store DIR] [--port 8080] [--host 127.0.0.1]`: the store browser.

    /                         every run, newest first: time, workload, faults, duration,
                              nodes, verdict (valid / invalid / unknown / crashed)
    /runs/<run path>/         a run folder's files; report.html is made on first request
                              for a run stored before reports existed
    /archive/<run path>.tar.gz  the run folder as an archive

Bound to 127.0.0.1 unless told otherwise: run folders hold node logs and command lines.
Bound to anything else it serves nothing without its token (`make_server(..., token=)`;
the command line prints one it drew, or takes `--token` / NEMESIS_SERVE_TOKEN): given once
as `?token=` it becomes an HttpOnly, SameSite=Strict cookie (and the URL loses it), or sent
as `Authorization: Bearer TOKEN`; compared in constant time; anything else is a 401 with one
line saying how to get in. On loopback a token is checked only if one was given.
Must never serve anything outside the store: every path is decoded once, refused if any
segment is `..` (or hides a separator or NUL), then resolved (symlinks included) and
refused unless it is still inside the store's resolved root.
"""

from __future__ import annotations

import hmac
import html
import io
import ipaddress
import logging
import mimetypes
import re
import tarfile
import threading
from dataclasses import dataclass
from http import HTTPStatus
from http.cookies import CookieError, SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

from nemesis.report.data import CRASHED, verdict_of
from nemesis.store import read_json

log = logging.getLogger("nemesis.report.serve")

VERDICT_COLOURS = {"valid": "#17702a", "invalid": "#b00020", "unknown": "#a15c00",
                   "crashed": "#555555"}
TEXT_TYPES = {".log": "text/plain", ".stderr": "text/plain", ".jsonl": "text/plain",
              ".json": "application/json", ".xml": "application/xml"}


@dataclass(frozen=True)
class RunEntry:
    path: Path  # the run folder, inside the store
    relative: str  # its path under the store, with "/"
    started: str
    workload: str
    faults: str
    duration_s: Any
    nodes: Any
    verdict: str
    canary: str | None
    sort_key: float


def list_runs(store: Path) -> list[RunEntry]:
    """Every run folder (a folder holding test.json or history.jsonl) under the store,
    newest first. `latest` is a link to one of them, so it is skipped."""
    store = Path(store)
    root = store.resolve()
    entries = []
    seen: set[Path] = set()
    for marker in sorted(store.glob("*/*/test.json")) + sorted(store.glob("*/*/history.jsonl")):
        run_dir = marker.parent
        resolved = run_dir.resolve()
        if resolved in seen or not resolved.is_relative_to(root) or run_dir.is_symlink():
            continue
        seen.add(resolved)
        test = _json(run_dir / "test.json")
        results = _json(run_dir / "results.json")
        config = test.get("config") or {}
        entries.append(RunEntry(
            path=run_dir, relative=resolved.relative_to(root).as_posix(),
            started=str(test.get("started") or run_dir.name),
            workload=str((test.get("workload") or {}).get("name") or run_dir.parent.name),
            faults=",".join(config.get("faults") or []) or "?",
            duration_s=config.get("duration_s", "?"), nodes=config.get("nodes", "?"),
            verdict=verdict_of(results) if results else CRASHED,
            canary=config.get("unsafe"), sort_key=run_dir.stat().st_mtime))
    entries.sort(key=lambda e: (e.started, e.sort_key), reverse=True)
    return entries


def _json(path: Path) -> dict[str, Any]:
    try:
        value = read_json(path)
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def resolve_inside(store: Path, url_path: str) -> Path | None:
    """The file or folder `url_path` (still %-encoded, relative to the store) names, or None
    if it would leave the store by any spelling: `..`, `%2e%2e`, `%2f`, backslashes, NUL,
    or a symlink that points outside."""
    decoded = unquote(url_path, errors="strict") if "%" in url_path else url_path
    if "\x00" in decoded or "\\" in decoded:
        return None
    parts = [p for p in decoded.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        return None
    root = Path(store).resolve()
    try:
        target = root.joinpath(*parts).resolve()
    except (OSError, RuntimeError):
        return None
    return target if target == root or target.is_relative_to(root) else None


def index_page(store: Path) -> str:
    runs = list_runs(store)
    rows = []
    for run in runs:
        base = "/runs/" + quote(run.relative)
        colour = VERDICT_COLOURS.get(run.verdict, "#555")
        report = (f"<a href='{base}/report.html'>report</a>"
                  if (run.path / "history.jsonl").exists() else "")
        rows.append(
            f"<tr><td>{html.escape(run.started)}</td><td>{html.escape(run.workload)}</td>"
            f"<td>{html.escape(run.faults)}"
            + (f" <b>canary {html.escape(run.canary)}</b>" if run.canary else "")
            + f"</td><td class='n'>{html.escape(str(run.duration_s))} s</td>"
            f"<td class='n'>{html.escape(str(run.nodes))}</td>"
            f"<td class='verdict' style='background:{colour}'>{run.verdict}</td>"
            f"<td>{report} <a href='{base}/'>files</a> "
            f"<a href='/archive/{quote(run.relative)}.tar.gz'>download .tar.gz</a></td></tr>")
    body = ("<table><tr><th>started</th><th>workload</th><th>faults</th><th>duration</th>"
            "<th>nodes</th><th>verdict</th><th></th></tr>" + "".join(rows) + "</table>"
            if rows else f"<p>No runs under {html.escape(str(store))} yet: "
                         f"<code>python -m nemesis run</code> makes one.</p>")
    return _page(f"nemesis runs in {store}", f"<h1>Runs in {html.escape(str(store))}</h1>"
                 f"<p class='meta'>{len(runs)} run(s), newest first. Verdicts: "
                 + " ".join(f"<span class='verdict' style='background:{c}'>{v}</span>"
                            for v, c in VERDICT_COLOURS.items())
                 + " (crashed = the harness did not finish the run)</p>" + body)


def _page(title: str, body: str) -> str:
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'><link rel='icon' href='data:,'>"
        f"<title>{html.escape(title)}</title><style>"
        "body{font:14px/1.45 system-ui,sans-serif;margin:20px;color:#1d1d1d}"
        "h1{font-size:18px}table{border-collapse:collapse;font-size:13px}"
        "th,td{border:1px solid #ddd;padding:4px 9px;text-align:left}th{background:#f6f6f6}"
        "td.n{text-align:right}.meta{color:#555}"
        ".verdict{color:white;font-weight:600;padding:2px 8px;border-radius:3px}"
        f"</style></head><body>{body}</body></html>\n")


def _listing(store: Path, folder: Path) -> str:
    relative = folder.relative_to(Path(store).resolve()).as_posix()
    items = []
    for child in sorted(folder.iterdir()):
        name = child.name + ("/" if child.is_dir() else "")
        items.append(f"<li><a href='{quote(child.name)}{'/' if child.is_dir() else ''}'>"
                     f"{html.escape(name)}</a></li>")
    return _page(relative, f"<p><a href='/'>all runs</a></p><h1>{html.escape(relative)}</h1>"
                 f"<ul>{''.join(items)}</ul>")


TOKEN_ENV = "NEMESIS_SERVE_TOKEN"


def is_loopback(host: str) -> bool:
    """Whether binding `host` keeps the server on this machine. A name other than
    `localhost`, or 0.0.0.0 / :: (every interface), is not."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _same(given: str, token: str) -> bool:
    # bytes: compare_digest refuses non-ASCII str, and a request can carry any
    return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), token.encode())


class StoreHandler(BaseHTTPRequestHandler):
    store: Path  # set on the subclass made by make_server
    token: str | None = None  # when set, nothing is served without it
    server_version = "nemesis-serve"

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.token is not None and not self._authorised():
            return
        path = urlsplit(self.path).path
        try:
            if path in ("/", "/index.html"):
                return self._send(HTTPStatus.OK, index_page(self.store).encode(), "text/html")
            if path == "/favicon.ico":  # browsers ask for it on text files; no icon, no error
                return self._send(HTTPStatus.NO_CONTENT, b"", "image/x-icon")
            if path.startswith("/runs/"):
                return self._run_file(path[len("/runs/"):], path.endswith("/"))
            if path.startswith("/archive/") and path.endswith(".tar.gz"):
                return self._archive(path[len("/archive/"):-len(".tar.gz")])
            return self._error(HTTPStatus.NOT_FOUND, "no such page")
        except UnicodeDecodeError:
            return self._error(HTTPStatus.BAD_REQUEST, "the path is not valid UTF-8")

    # --- the token ------------------------------------------------------------------------

    def _cookie_name(self) -> str:
        # cookies ignore the port: two servers on one host must not overwrite each other's
        return f"nemesis_token_{self.server.server_address[1]}"

    def _authorised(self) -> bool:
        """True if the request carries the token; otherwise answers it (401, or the
        redirect that swaps a `?token=` for the cookie) and returns False."""
        assert self.token is not None
        header = self.headers.get("Authorization", "")
        if header[:7].lower() == "bearer " and _same(header[7:].strip(), self.token):
            return True
        try:
            morsel = SimpleCookie(self.headers.get("Cookie", "")).get(self._cookie_name())
        except CookieError:
            morsel = None
        if morsel is not None and _same(morsel.value, self.token):
            return True
        url = urlsplit(self.path)
        query = parse_qsl(url.query, keep_blank_values=True)
        given = [value for name, value in query if name == "token"]
        if given and _same(given[-1], self.token):
            # the cookie from now on, and the token out of the address bar and history
            rest = urlencode([(n, v) for n, v in query if n != "token"])
            self.send_response(HTTPStatus.SEE_OTHER)
            self.send_header("Set-Cookie", f"{self._cookie_name()}={self.token}; Path=/; "
                                           "HttpOnly; SameSite=Strict")
            self.send_header("Location", url.path + (f"?{rest}" if rest else ""))
            self.send_header("Content-Length", "0")
            self.end_headers()
            return False
        why = ("wrong token" if given or header or morsel is not None else "no token")
        log.warning("%s refused: %s", self.address_string(), why)
        body = (f"401 Unauthorized ({why}): this store browser needs its token: open the "
                f"address `python -m nemesis serve` printed (ending ?token=...), or send "
                f"'Authorization: Bearer TOKEN'\n").encode()
        self.send_response(HTTPStatus.UNAUTHORIZED)
        self.send_header("WWW-Authenticate", 'Bearer realm="nemesis serve"')
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        return False

    # --- the store --------------------------------------------------------------------------

    def _run_file(self, relative: str, wants_folder: bool) -> None:
        target = resolve_inside(self.store, relative)
        if target is None:
            return self._error(HTTPStatus.FORBIDDEN, "that path is outside the store")
        if target.is_dir():
            if not wants_folder:  # relative links inside need the trailing slash
                return self._redirect(self.path.split("?")[0] + "/")
            return self._send(HTTPStatus.OK, _listing(self.store, target).encode(), "text/html")
        if (not target.exists() and target.name == "report.html"
                and (target.parent / "history.jsonl").exists()):
            from nemesis.report import write_report

            write_report(target.parent)  # a run stored before reports existed
        if not target.is_file():
            return self._error(HTTPStatus.NOT_FOUND, "no such file in the store")
        kind = TEXT_TYPES.get(target.suffix) or mimetypes.guess_type(target.name)[0]
        self._send(HTTPStatus.OK, target.read_bytes(), kind or "application/octet-stream")

    def _archive(self, relative: str) -> None:
        target = resolve_inside(self.store, relative)
        root = Path(self.store).resolve()
        if target is None or target == root:
            return self._error(HTTPStatus.FORBIDDEN, "that path is outside the store")
        if not target.is_dir():
            return self._error(HTTPStatus.NOT_FOUND, "no such run folder")
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
            archive.add(target, arcname=target.name,
                        filter=lambda info: None if info.issym() or info.islnk() else info)
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "application/gzip")
        self.send_header("Content-Disposition", f'attachment; filename="{target.name}.tar.gz"')
        self.send_header("Content-Length", str(buffer.getbuffer().nbytes))
        self.end_headers()
        self.wfile.write(buffer.getvalue())

    def _send(self, status: HTTPStatus, body: bytes, kind: str) -> None:
        self.send_response(status)
        charset = "; charset=utf-8" if kind.startswith("text/") or kind.endswith("json") else ""
        self.send_header("Content-Type", kind + charset)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _redirect(self, location: str) -> None:
        self.send_response(HTTPStatus.FOUND)
        self.send_header("Location", location)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _error(self, status: HTTPStatus, why: str) -> None:
        self._send(status, _page(str(status.value), f"<h1>{status.value} {status.phrase}</h1>"
                                 f"<p>{html.escape(why)}. <a href='/'>All runs</a></p>").encode(),
                   "text/html")

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's name
        log.info("%s %s", self.address_string(), format % args)


_TOKEN_SHAPE = re.compile(r"[A-Za-z0-9._~-]{16,}")


class TokenRequired(ValueError):
    """make_server was asked to listen beyond loopback without a token."""


def make_server(store: Path, host: str = "127.0.0.1", port: int = 8080,
                token: str | None = None) -> ThreadingHTTPServer:
    """The store browser on host:port. Beyond loopback it needs `token` (refused without
    one, so no caller can open run folders to the network by forgetting it); on loopback a
    given token is checked all the same."""
    if token is not None and not _TOKEN_SHAPE.fullmatch(token):
        raise TokenRequired("a token must be at least 16 characters of A-Z a-z 0-9 - _ . ~ "
                            "(it goes into a URL and a cookie as it is)")
    if token is None and not is_loopback(host):
        raise TokenRequired(f"serving on {host} (beyond this machine) needs a token")
    handler = type("BoundStoreHandler", (StoreHandler,), {"store": Path(store), "token": token})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    return server


def serve_in_thread(store: Path, host: str = "127.0.0.1", port: int = 0,
                    token: str | None = None) -> tuple[ThreadingHTTPServer, threading.Thread]:
    """For tests and embedding: a server on its own thread; stop with server.shutdown()
    and server.server_close()."""
    server = make_server(store, host, port, token)
    thread = threading.Thread(target=server.serve_forever, name="nemesis-serve", daemon=True)
    thread.start()
    return server, thread
