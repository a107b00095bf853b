"""A pause point resumes on SIGCONT even when the main thread cannot run Python.

The coordinator reaches its pause points on gRPC and lease threads while its main thread
sits in C calls; Python runs signal handlers only in the main thread, between bytecodes.
A resumed coordinator that waited on the handler alone stayed stopped in effect (it was
seen twice in CI, a failover test timing out on a coordinator that never went on).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

CHILD = textwrap.dedent("""
    import ctypes, os, signal, threading, time
    from system.trainer import pause_points
    pause_points.install()
    SLEEPS = {"35", "230"}  # nanosleep, clock_nanosleep (x86-64)

    def main_thread_sleeps():
        with open(f"/proc/self/task/{os.getpid()}/syscall") as f:
            return f.read().split()[0] in SLEEPS

    def pauser():
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCONT})  # only this thread
        # Stop only once the main thread is inside its C sleep: stopped anywhere before
        # it, it would run the handler on its next bytecode and hide the bug.
        while not main_thread_sleeps():
            time.sleep(0.01)
        pause_points.reach("before-head-cas", 7)
        print("resumed", flush=True)

    # The main thread leaves Python for a long C call with SIGCONT blocked, as a thread
    # in a gRPC wait holds it away from the handler: the kernel gives the signal to the
    # paused thread, and the Python-level handler cannot run until the call returns.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCONT})
    threading.Thread(target=pauser).start()
    ctypes.CDLL(None).sleep(120)
""")


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def test_a_paused_thread_resumes_while_the_main_thread_is_in_a_c_call() -> None:
    env = dict(os.environ, MAO_ALLOW_UNSAFE="1", TRAINER_PAUSE_AT="before-head-cas:7")
    child = subprocess.Popen([sys.executable, "-c", CHILD], env=env, stdout=subprocess.PIPE,
                             text=True)
    try:
        deadline = time.monotonic() + 60
        while _state(child.pid) != "T":
            assert time.monotonic() < deadline, "the child never stopped at its pause point"
            assert child.poll() is None, "the child exited before its pause point"
            time.sleep(0.02)
        os.kill(child.pid, signal.SIGCONT)
        # The main thread's sleep lasts 120 s; a resume that waits for it misses this.
        line = _read_line(child, timeout=60)
        assert line == "resumed", f"the paused thread did not go on after SIGCONT: {line!r}"
    finally:
        child.kill()
        child.wait()


def _read_line(child: subprocess.Popen, timeout: float) -> str:
    import selectors
    with selectors.DefaultSelector() as sel:
        sel.register(child.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            return ""
    return child.stdout.readline().strip()
