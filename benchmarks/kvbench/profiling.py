"""Where a server process spends its time during one row: py-spy samples it from outside
(no change to the server, no restart) and this module sums the samples per function.

Used by `kv_bench.py --profile` on our leader during the 64-client put row, so the report
can say what limits the figures. py-spy is optional (installed by
`benchmarks/setup_kv_bench.sh`); without it the profile is skipped with a note. It must
never be attached to a process the benchmark did not start.
"""

from __future__ import annotations

import collections
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from benchmarks.kvbench.processes import dying_with_parent


@dataclass(frozen=True)
class FunctionShare:
    function: str  # "name (file:line)" as py-spy prints it
    self_percent: float  # samples with this function on top of the stack
    total_percent: float  # samples with this function anywhere on the stack


@dataclass(frozen=True)
class Profile:
    samples: int
    top_self: tuple[FunctionShare, ...]
    top_total_in_project: tuple[FunctionShare, ...]  # functions under system/


class Sampler:
    """Start py-spy on a pid for duration_s; `result()` waits for it and summarises."""

    def __init__(self, pid: int, duration_s: float, output: Path, rate_hz: int = 100,
                 gil_only: bool = False):
        self.output = output
        executable = shutil.which("py-spy")
        if executable is None:
            raise FileNotFoundError("py-spy is not installed: run `bash benchmarks/setup_kv_bench.sh`")
        self._process = subprocess.Popen(
            dying_with_parent([
                executable, "record",
                "--pid", str(pid),
                "--duration", str(max(1, round(duration_s))),
                "--rate", str(rate_hz),
                "--format", "raw",
                "--output", str(output),
                "--nonblocking",  # never pause the server it samples
                # --gil: only the thread holding the GIL, i.e. where Python CPU goes
                # (without it a thread blocked in C, such as fsync, counts as busy).
                *(["--gil"] if gil_only else []),
            ]),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )  # fmt: skip

    def result(self, timeout_s: float = 60.0, top: int = 12) -> Profile:
        try:
            _, stderr = self._process.communicate(timeout=timeout_s)
        finally:
            if self._process.poll() is None:
                self._process.kill()
                self._process.wait()
        if not self.output.exists():
            raise RuntimeError(f"py-spy wrote no profile: {stderr.decode(errors='replace').strip()[-300:]}")
        return summarise(self.output.read_text(), top)


def summarise(collapsed_stacks: str, top: int = 12) -> Profile:
    """Sum py-spy's raw (collapsed) stacks, `frame;frame;... count` per line."""
    total = 0
    self_samples: collections.Counter[str] = collections.Counter()
    total_samples: collections.Counter[str] = collections.Counter()
    for line in collapsed_stacks.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [frame for frame in stack.split(";") if frame]
        if not frames:
            continue
        total += count
        self_samples[_function(frames[-1])] += count
        for function in {_function(frame) for frame in frames}:
            total_samples[function] += count
    if total == 0:
        return Profile(0, (), ())

    def share(function: str) -> FunctionShare:
        return FunctionShare(
            function, 100 * self_samples[function] / total, 100 * total_samples[function] / total
        )

    in_project = [
        function
        for function, _ in total_samples.most_common()
        if "system/" in function and not function.startswith(("<module>", "main ", "serve "))
    ]
    return Profile(
        total,
        tuple(share(function) for function, _ in self_samples.most_common(top)),
        tuple(share(function) for function in in_project[:top]),
    )


def _function(frame: str) -> str:
    """'name (path/file.py:123)' -> 'name (file.py)' so lines of one function add up,
    keeping the package folder for project code (system/kv/storage.py)."""
    name, _, location = frame.partition(" (")
    path = location.rstrip(")").rsplit(":", 1)[0]
    parts = path.split("/")
    short = "/".join(parts[-3:]) if "system" in parts else parts[-1]
    return f"{name} ({short})"
