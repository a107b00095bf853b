"""How each stage of the node image's build (nemesis/platforms/image.py) reports itself.

A first build runs for minutes (debootstrap alone took 144 s at load 2-23, the dependency
layer 87 s), and a build that prints nothing for that long looks hung. So every stage
says, on the build's log:

- the tool's own output, condensed: one line when it enters a phase (the first word of a
  line: debootstrap's `I: Retrieving`, `I: Extracting`, `I: Configuring`; apt's `Get:`,
  `Unpacking`, `Setting up`; a `docker build`'s `Step 2/5`), with the stage's elapsed
  seconds. A phase it comes back to is said again only after REPEAT_AFTER_S of no line:
  debootstrap alternates `Retrieving x` / `Validating x` for each of ~100 packages within a
  second or two, which is one line each, not two hundred;
- `still building: <stage>, N s; last: <the tool's latest line>` whenever nothing was said
  for PROGRESS_EVERY_S (a stage with no output of its own, an import or a download, says
  only this).

What it must never do: leave a process behind (a tool interrupted mid-stage is killed and
reaped), or hold the build up (the ticker is a daemon thread, stopped when the stage ends).
"""

from __future__ import annotations

import collections
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType

PROGRESS_EVERY_S = 10.0  # the longest a stage stays silent (plain log lines, as the run's)
REPEAT_AFTER_S = 5.0  # a phase come back to is said again after this long without a line
TAIL_LINES = 15  # of a failed tool's output, kept for its error

Log = Callable[[str], None]


def first_words(line: str) -> str | None:
    """The phase a line of a tool's output belongs to: its first word (two for
    debootstrap's `I: Verb` and docker's `Step N/M`); None for a blank line."""
    words = line.split()
    if not words:
        return None
    if len(words) > 1 and (words[0] in ("I:", "W:", "E:") or words[0] == "Step"):
        return " ".join(words[:2])
    if words[0].startswith("Get:"):  # apt's numbered downloads: Get:1, Get:2, ...
        return "Get:"
    return words[0]


def docker_steps(line: str) -> str | None:
    """A `docker build`'s phases: its `Step N/M : ...` lines; the rest (pip's output, layer
    ids) only feeds the `still building` line."""
    return " ".join(line.split()[:2]) if line.startswith("Step ") else None


class Stage:
    """One stage of the build, reported as the module docstring says. Use as a context
    manager; feed it the tool's output with `output(line)`."""

    def __init__(self, name: str, log: Log, every_s: float | None = None,
                 phase: Callable[[str], str | None] = first_words,
                 repeat_after_s: float | None = None) -> None:
        self.name, self.log, self.phase = name, log, phase
        self.every_s = PROGRESS_EVERY_S if every_s is None else every_s
        self.repeat_after_s = REPEAT_AFTER_S if repeat_after_s is None else repeat_after_s
        self.last_line = ""  # the tool's latest output line
        self._phase: str | None = None  # the phase of the latest line that had one
        self._seen: set[str] = set()  # every phase said so far
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        self.started = self._said_at = time.monotonic()

    def __enter__(self) -> Stage:
        self.started = self._said_at = time.monotonic()
        self._ticker = threading.Thread(target=self._tick, name=f"build: {self.name}",
                                        daemon=True)
        self._ticker.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()

    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    def say(self, text: str) -> None:
        with self._lock:
            self._said_at = time.monotonic()
        self.log(f"  {self.name}: {text} ({self.elapsed_s():.0f} s)")

    def output(self, line: str) -> None:
        """One line of the tool's output: said when it enters a phase (see the module's
        docstring), else kept for the `still building` line."""
        line = line.strip()
        if not line:
            return
        self.last_line = line
        phase = self.phase(line)
        if phase is None or phase == self._phase:
            return
        self._phase = phase
        with self._lock:
            quiet_s = time.monotonic() - self._said_at
        if phase not in self._seen or quiet_s >= self.repeat_after_s:
            self._seen.add(phase)
            self.say(line[:120])

    def _tick(self) -> None:
        while True:
            with self._lock:
                due = self._said_at + self.every_s
            if self._stop.wait(max(0.0, due - time.monotonic())):
                return
            with self._lock:
                if time.monotonic() < self._said_at + self.every_s:
                    continue  # something was said meanwhile
                self._said_at = time.monotonic()
            last = f"; last: {self.last_line[:100]}" if self.last_line else ""
            self.log(f"  still building: {self.name}, {self.elapsed_s():.0f} s{last}")


def stream(cmd: Sequence[str], stage: Stage, env: Mapping[str, str] | None = None
           ) -> tuple[int, list[str]]:
    """Run `cmd` with its output (stdout and stderr) going to `stage` line by line; its exit
    code and last TAIL_LINES lines. Interrupted (Ctrl-C), the tool is killed and reaped."""
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, text=True, errors="replace", bufsize=1,
                            env=dict(env) if env is not None else None)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            tail.append(line.rstrip())
            stage.output(line)
        return proc.wait(), list(tail)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
