"""The node image's build says what it does while it does it, and waits for the package
manager's lock instead of failing at once — driven by fake tools (small Python scripts on
PATH) and a lock held by a child process on a file of the test's own: no real image is
built, no real apt lock is touched."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from nemesis.platforms import apt_lock, image
from nemesis.platforms.base import PlatformUnavailable
from nemesis.platforms.build_progress import Stage, stream

sys.path.insert(0, str(Path(__file__).resolve().parent))
from waiting import wait_until  # noqa: E402


class Lines:
    """A build log that tests can wait on."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._lock = threading.Lock()

    def __call__(self, line: str) -> None:
        with self._lock:
            self.lines.append(line)

    def having(self, text: str) -> list[str]:
        with self._lock:
            return [line for line in self.lines if text in line]

    def __str__(self) -> str:
        with self._lock:
            return "\n".join(self.lines)


def _tool(path: Path, body: str) -> Path:
    """An executable Python script standing in for a tool (debootstrap, apt-get)."""
    path.write_text(f"#!{sys.executable}\nimport os, sys, time\nfrom pathlib import Path\n{body}")
    path.chmod(0o755)
    return path


# A debootstrap that prints what the real one prints, phase by phase, and then stays quiet
# until the test lets it go (so the test sees the `still building` line with no sleep).
FAKE_DEBOOTSTRAP = """
root = Path(sys.argv[-2])
go = Path(os.environ["FAKE_GO"])
for line in ["I: Retrieving InRelease", "I: Checking Release signature",
             "I: Retrieving libacl1 2.3.1-3", "I: Retrieving libc6 2.36-9",
             "I: Validating libacl1 2.3.1-3", "I: Validating libc6 2.36-9",
             "I: Extracting libacl1...", "I: Extracting libc6..."]:
    print(line, flush=True)
deadline = time.monotonic() + 60
while not go.exists() and time.monotonic() < deadline:
    time.sleep(0.01)
(root / "etc").mkdir(parents=True)
(root / "etc" / "debian_version").write_text("12.0\\n")
print("I: Configuring libc-bin...", flush=True)
print("I: Base system installed successfully.", flush=True)
"""


def test_a_stage_condenses_the_tools_output_and_says_it_is_still_building(tmp_path: Path) -> None:
    log = Lines()
    go = tmp_path / "go"
    tool = _tool(tmp_path / "debootstrap", FAKE_DEBOOTSTRAP)
    result: list[tuple[int, list[str]]] = []

    def build() -> None:
        with Stage("debootstrap", log, every_s=0.2, repeat_after_s=float("inf")) as stage:
            result.append(stream([str(tool), "bookworm", str(tmp_path / "root"), "mirror"],
                                 stage, env=dict(os.environ, FAKE_GO=str(go))))

    runner = threading.Thread(target=build)
    runner.start()
    try:
        # The tool is quiet after its last line until the test lets it go.
        wait_until(lambda: log.having("; last: I: Extracting libc6..."), 60,
                   "a `still building` line while the tool is quiet", lambda: str(log))
        assert all(line.startswith("  still building: debootstrap, ")
                   for line in log.having("; last: "))
    finally:
        go.touch()
        runner.join(60)
    code, tail = result[0]
    assert code == 0 and tail[-1] == "I: Base system installed successfully."
    said = [line.split(": ", 1)[1].rsplit(" (", 1)[0] for line in log.having("  debootstrap: ")]
    # one line per phase, not per package
    assert said == ["I: Retrieving InRelease", "I: Checking Release signature",
                    "I: Validating libacl1 2.3.1-3", "I: Extracting libacl1...",
                    "I: Configuring libc-bin...", "I: Base system installed successfully."]
    assert all(line.endswith(" s)") for line in log.having("  debootstrap: "))


def test_a_phase_come_back_to_is_said_again_only_after_a_quiet_spell() -> None:
    """debootstrap alternates `Retrieving x` and `Validating x` for every package."""
    alternating = ["I: Retrieving a 1", "I: Validating a 1", "I: Retrieving b 1",
                   "I: Validating b 1", "I: Retrieving b 1"]
    log = Lines()
    stage = Stage("debootstrap", log, repeat_after_s=float("inf"))
    for line in [*alternating, "I: Unpacking required packages...", "I: Unpacking x..."]:
        stage.output(line)
    assert [line.split(": ", 1)[1].rsplit(" (", 1)[0] for line in log.lines] == [
        "I: Retrieving a 1", "I: Validating a 1", "I: Unpacking required packages..."]
    log = Lines()
    stage = Stage("debootstrap", log, repeat_after_s=0.0)  # every spell is long enough
    for line in [*alternating, "I: Retrieving c 1"]:
        stage.output(line)
    assert len(log.lines) == 5  # each change of phase said, a repeated phase never


def test_the_rootfs_step_shows_debootstrap_and_packing_as_they_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """debootstrap ran silent for 144 s (its output captured until it ended)."""
    log = Lines()
    go = tmp_path / "go"
    tool = _tool(tmp_path / "debootstrap", FAKE_DEBOOTSTRAP)
    monkeypatch.setenv("MAO_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("FAKE_GO", str(go))
    monkeypatch.setattr(image, "_ensure_debootstrap", lambda log: str(tool))
    monkeypatch.setattr(image.os, "geteuid", lambda: 0)
    monkeypatch.setattr("nemesis.platforms.build_progress.PROGRESS_EVERY_S", 0.2)
    made: list[Path] = []
    runner = threading.Thread(target=lambda: made.append(image.rootfs_tarball(log)))
    runner.start()
    try:
        # Before debootstrap has finished, the log already shows its phases and that it runs.
        wait_until(lambda: log.having("still building: debootstrap, ") and log.having(
            "last: I: Extracting libc6..."), 60, "debootstrap's progress while it runs",
                   lambda: str(log))
        assert log.having("  debootstrap: I: Extracting libacl1...")
    finally:
        go.touch()
        runner.join(60)
    assert made and made[0].exists()
    with tarfile.open(made[0]) as tar:
        assert "./etc/debian_version" in tar.getnames()
    assert log.having("debootstrap done")
    assert not list((tmp_path / "cache").glob("rootfs-*/"))  # no temporary directory left


def test_a_failing_tool_is_one_error_with_its_last_output(tmp_path: Path) -> None:
    tool = _tool(tmp_path / "debootstrap", "print('E: Couldn\\'t download packages', flush=True)\n"
                                           "sys.exit(1)\n")
    with pytest.raises(PlatformUnavailable) as caught:
        image._stage_run([str(tool), "bookworm"], "debootstrap", Lines())
    assert "debootstrap failed (exit 1)" in str(caught.value)
    assert "E: Couldn't download packages" in str(caught.value)


def test_docker_build_steps_are_said_and_the_rest_feeds_the_still_building_line() -> None:
    class Images:
        def get(self, tag: str) -> object:
            return object()

    class Api:
        def build(self, **kwargs: object) -> Iterator[dict]:
            yield {"stream": "Step 1/3 : FROM mao-base:x\n"}
            yield {"stream": " ---> 1234\n"}
            yield {"stream": "Step 2/3 : COPY wheels /tmp/wheels\n"}
            yield {"stream": "Step 3/3 : RUN python3 pip install ...\n"}
            yield {"stream": "Processing /tmp/wheels/numpy.whl\nProcessing /tmp/wheels/grpcio.whl\n"}
            yield {"stream": "Successfully built 5678\n"}

    class Client:
        images, api = Images(), Api()

    log = Lines()
    image._build(Client(), Path("/nonexistent"), "mao-deps:abc", "deps", "x", log)
    said = log.having("  docker build mao-deps:abc: ")
    assert [line.split(": ", 1)[1].rsplit(" (", 1)[0] for line in said] == [
        "Step 1/3 : FROM mao-base:x", "Step 2/3 : COPY wheels /tmp/wheels",
        "Step 3/3 : RUN python3 pip install ..."]


# ----- the package manager's lock -------------------------------------------------------

@pytest.fixture()
def held_lock(tmp_path: Path) -> Iterator[tuple[Path, subprocess.Popen]]:
    """A lock file of the test's own, write-locked (fcntl, as apt and dpkg lock) by a child
    process until the test closes its stdin."""
    path = tmp_path / "lock-frontend"
    path.write_bytes(b"")
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, sys\nf = open(sys.argv[1], 'w')\n"
         "fcntl.lockf(f, fcntl.LOCK_EX)\nprint('held', flush=True)\nsys.stdin.read()", str(path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        yield path, holder
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.wait()


def _release(holder: subprocess.Popen) -> None:
    assert holder.stdin is not None
    holder.stdin.close()
    holder.wait(30)


# An apt-get that records that it ran (and with what), and that it ran after the lock
# was free; FAKE_APT_REFUSALS times it first answers as apt does when the lock is taken.
FAKE_APT = """
runs = Path(os.environ["FAKE_APT_RUNS"])
n = len(runs.read_text().splitlines()) if runs.exists() else 0
with runs.open("a") as f:
    f.write(" ".join(sys.argv[1:]) + "\\n")
if n < int(os.environ.get("FAKE_APT_REFUSALS", "0")):
    print("E: Could not get lock /var/lib/dpkg/lock-frontend. It is held by process 4242 (apt-get)")
    print("E: Unable to acquire the dpkg frontend lock (/var/lib/dpkg/lock-frontend), is another process using it?")
    sys.exit(100)
print("Reading package lists...", flush=True)
if sys.argv[1] == "install":
    debootstrap = Path(os.environ["FAKE_BIN"]) / "debootstrap"
    debootstrap.write_text("#!/bin/sh\\n")
    debootstrap.chmod(0o755)
    print("Setting up debootstrap (1.0.128+nmu2+deb12u2) ...", flush=True)
"""


def _fake_apt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lock: Path,
              refusals: int = 0) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _tool(bin_dir / "apt-get", FAKE_APT)
    runs = tmp_path / "apt-runs"
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setenv("FAKE_BIN", str(bin_dir))
    monkeypatch.setenv("FAKE_APT_RUNS", str(runs))
    monkeypatch.setenv("FAKE_APT_REFUSALS", str(refusals))
    monkeypatch.setattr(apt_lock, "APT_LOCKS", (lock,))
    monkeypatch.setattr(apt_lock, "POLL_S", 0.02)
    monkeypatch.setattr(image, "DEBOOTSTRAP_FALLBACK", tmp_path / "no-such-debootstrap")
    monkeypatch.setattr(image.os, "geteuid", lambda: 0)
    return runs


def test_installing_debootstrap_waits_for_the_package_managers_lock_saying_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        held_lock: tuple[Path, subprocess.Popen]) -> None:
    """The build failed at once when another process held the package manager's lock."""
    lock, holder = held_lock
    runs = _fake_apt(tmp_path, monkeypatch, lock)
    log = Lines()
    found: list[str] = []
    installer = threading.Thread(target=lambda: found.append(image._ensure_debootstrap(log)))
    installer.start()
    try:
        waiting = wait_until(lambda: log.having("waiting for the package manager") or
                             not installer.is_alive(), 60, "the build to say it waits",
                             lambda: str(log))
        assert waiting is not True, f"apt-get ran while the lock was held:\n{log}"
        assert f"pid {holder.pid} (" in waiting[0] and str(lock) in waiting[0]
        assert not runs.exists(), "apt-get ran while another process held the lock"
    finally:
        _release(holder)
        installer.join(60)
    assert found == [str(tmp_path / "bin" / "debootstrap")]
    assert runs.read_text().splitlines() == ["install -y debootstrap"]
    assert log.having("the package manager's lock is free after")
    assert log.having("  apt-get install -y debootstrap: Setting up debootstrap")


def test_a_lock_held_past_the_wait_is_one_error_naming_its_holder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        held_lock: tuple[Path, subprocess.Popen]) -> None:
    lock, holder = held_lock
    runs = _fake_apt(tmp_path, monkeypatch, lock)
    monkeypatch.setattr(apt_lock, "APT_LOCK_WAIT_S", 0.3)
    log = Lines()
    with pytest.raises(PlatformUnavailable) as caught:
        image._ensure_debootstrap(log)
    message = str(caught.value)
    assert "\n" not in message
    assert f"lock {lock} was still held by pid {holder.pid} (" in message
    assert message.endswith("let that process finish (or stop it), then build again")
    assert not runs.exists()


def test_apt_get_refused_for_the_lock_is_run_again_once_it_is_free(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The lock taken between the look and apt-get's own attempt (a race no look can
    close): apt-get's refusal is waited out too, within the same bound."""
    runs = _fake_apt(tmp_path, monkeypatch, tmp_path / "free-lock", refusals=2)
    log = Lines()
    assert image._ensure_debootstrap(log) == str(tmp_path / "bin" / "debootstrap")
    assert runs.read_text().splitlines() == ["install -y debootstrap"] * 3
    assert len(log.having("apt-get found the package manager's lock taken")) == 2


def test_a_real_failure_of_apt_get_is_not_mistaken_for_the_lock(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _tool(bin_dir / "apt-get", "print('E: Unable to locate package debootstrap')\nsys.exit(100)\n")
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setattr(apt_lock, "APT_LOCKS", ())
    with pytest.raises(PlatformUnavailable) as caught:
        apt_lock.apt_get(["install", "-y", "debootstrap"], Lines(), deadline=float("inf"))
    assert "failed (exit 100)" in str(caught.value)
    assert "Unable to locate package debootstrap" in str(caught.value)
