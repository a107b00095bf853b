"""A disk that forgets what was not fsynced: a FUSE passthrough layer for the `lose-unsynced` fault.

LazyFS's idea, in a few hundred lines over libfuse 3 (through `mfusepy`): the layer is
mounted over a backing directory and shows its files as they are, but it keeps every
file's writes and size changes (write, truncate, ftruncate, open with O_TRUNC) in its own
memory until that file is fsynced (fsync or fdatasync: both make data and size durable
here). Reads are served from the backing file with the pending changes laid over it, so
the program sees its own writes. Closing a file makes nothing durable, as on a real disk.

The `slow-disk` fault makes every fsync wait a random delay first (`slow LOW HIGH` on the
control socket, in ms; the layer serves one request at a time, so the node's other I/O on
it waits too, as behind a slow device's queue).

A power cut is killing this process (SIGKILL): its memory, hence every unsynced write,
is gone, and the backing directory holds exactly what was fsynced (plus what the
writeback below pushed out early). A process crash is not a power cut: the page cache of a
real machine survives it. So the harness asks the layer to `flush` (through its control
socket) after the node died: every pending change is written to the backing files, and
from then on the layer writes through until it is unmounted.

What is not modelled (say so in any result that relies on it):
- Metadata is not lazy. create, mkdir, rename, unlink, rmdir, link, symlink, chmod and
  utimens go straight to the backing directory; a real file system can also lose an
  unsynced create or rename on power loss (which is why the store fsyncs directories),
  and here those survive. Directory fsync is accepted and does nothing.
- Durability is per file, whole: fsync of a file makes all its pending changes durable;
  no partial or reordered survival of unsynced writes (a real disk may keep some).
- Memory is bounded by `--max-pending-mb` (default 256): past it the file with the most
  pending bytes is written back to its backing file without fsync, as a kernel's
  writeback would — legal behaviour (an unsynced write MAY survive a power cut), but it
  means a huge unsynced burst is not entirely lost.
- Files are removed at once on unlink (libfuse's hard_remove): I/O on a file that is
  open but already unlinked fails with an error instead of reaching a hidden file.
- flock is not implemented by the layer, so the kernel keeps flock locks itself, per
  mount: enough for the store's one-process lock on DATA_DIR/LOCK.

Usage: `python -m nemesis.lazyfs mount MOUNTPOINT --backing DIR --control SOCKET` runs in
the foreground and unmounts on SIGTERM/SIGINT; `python -m nemesis.lazyfs flush SOCKET`
writes every pending change back, switches the layer to write-through and returns once
that is done (exit 0), which is the acknowledgement a harness waits for.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import random
import shutil
import socket
import stat
import sys
import threading
import time
from pathlib import Path
from typing import Any

PAGE = 4096
FSNAME = "mao-lazyfs"  # the fs type in /proc/mounts is fuse.mao-lazyfs: `clean` looks for it
FS_TYPE = f"fuse.{FSNAME}"
DEFAULT_MAX_PENDING_MB = 256
MAX_FSYNC_DELAY_MS = 5000.0  # the slow-disk fault's bound: slow, never hung
PARENT_ENV = "MAO_LAZYFS_PARENT_PID"  # the layer unmounts (SIGTERM) when that process dies


class LazyFSError(RuntimeError):
    """The layer cannot run here; the message says why and what to do."""


class Pending:
    """One file's changes since its last fsync, over the backing file's content.

    The logical content: bytes below `cut` come from the backing file, bytes at or above
    it read as zero (a pending truncate cut them off, a later extension brings zeros),
    and each page in `pages` replaces the whole page there. Invariant: cut <= size, and
    the bytes of a page at or beyond `size` are zero.
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd  # our own descriptor of the backing file (survives rename/close)
        backing = os.fstat(fd).st_size
        self.size = backing
        self.cut = backing
        self.pages: dict[int, bytearray] = {}

    @property
    def bytes(self) -> int:
        return len(self.pages) * PAGE

    def _page(self, index: int) -> bytearray:
        page = self.pages.get(index)
        if page is None:
            page = bytearray(PAGE)
            start = index * PAGE
            if start < self.cut:
                data = os.pread(self.fd, min(PAGE, self.cut - start), start)
                page[: len(data)] = data
            self.pages[index] = page
        return page

    def write(self, data: bytes, offset: int) -> None:
        end = offset + len(data)
        pos = offset
        while pos < end:
            index, within = divmod(pos, PAGE)
            n = min(PAGE - within, end - pos)
            self._page(index)[within: within + n] = data[pos - offset: pos - offset + n]
            pos += n
        self.size = max(self.size, end)

    def truncate(self, length: int) -> None:
        if length < self.size:
            index, within = divmod(length, PAGE)
            if within and index in self.pages:
                self.pages[index][within:] = bytes(PAGE - within)
            for i in [i for i in self.pages if i * PAGE >= length]:
                del self.pages[i]
            self.cut = min(self.cut, length)
        self.size = length

    def read(self, size: int, offset: int) -> bytes:
        end = min(offset + size, self.size)
        if offset >= end:
            return b""
        out = bytearray(end - offset)
        base_end = min(end, self.cut)
        if base_end > offset:
            data = os.pread(self.fd, base_end - offset, offset)
            out[: len(data)] = data
        for index in range(offset // PAGE, (end - 1) // PAGE + 1):
            page = self.pages.get(index)
            if page is None:
                continue
            lo = max(offset, index * PAGE)
            hi = min(end, (index + 1) * PAGE)
            out[lo - offset: hi - offset] = page[lo - index * PAGE: hi - index * PAGE]
        return bytes(out)

    def write_back(self) -> None:
        """Put the logical content into the backing file (no fsync: the caller decides)."""
        if os.fstat(self.fd).st_size > self.cut:
            os.ftruncate(self.fd, self.cut)
        for index in sorted(self.pages):
            start = index * PAGE
            n = min(PAGE, self.size - start)
            if n > 0:
                os.pwrite(self.fd, self.pages[index][:n], start)
        if os.fstat(self.fd).st_size != self.size:
            os.ftruncate(self.fd, self.size)


def _operations_base():  # noqa: ANN202 - mfusepy.Operations, imported late for a clear error
    os.environ.setdefault("FUSE_LIBRARY_NAME", "fuse3")  # never libfuse 2, if both exist
    try:
        import mfusepy
    except ImportError:
        raise LazyFSError("the mfusepy package is missing: run `python3 -m pip install -e .`"
                          ) from None
    except OSError as exc:  # mfusepy raises when it finds no libfuse
        raise LazyFSError(f"libfuse 3 is missing ({exc}): install it with "
                          f"`apt-get install fuse3`") from None
    return mfusepy


def check_fuse() -> None:
    """Raise LazyFSError (one line) when FUSE cannot be mounted here."""
    if not Path("/dev/fuse").exists():
        raise LazyFSError("/dev/fuse is missing: load the fuse module (modprobe fuse), or give "
                          "the container the device (--device /dev/fuse --cap-add SYS_ADMIN)")
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        raise LazyFSError("/dev/fuse is not readable and writable by this user")
    if os.geteuid() != 0 and shutil.which("fusermount3") is None:
        raise LazyFSError("fusermount3 is missing (a user who is not root mounts through it): "
                          "install it with `apt-get install fuse3`")


def fuse_unavailable() -> str:
    """Why the layer cannot mount here (the device, fusermount3, mfusepy or libfuse 3
    missing), or "" when it can."""
    try:
        check_fuse()
        _operations_base()
    except LazyFSError as exc:
        return str(exc)
    return ""


def make_layer(backing: Path, max_pending_bytes: int):  # noqa: ANN201 - a LazyLayer
    mfusepy = _operations_base()

    class LazyLayer(mfusepy.Operations):
        use_ns = True

        def __init__(self) -> None:
            self.root = str(backing)
            self._mutex = threading.RLock()
            self.pending: dict[tuple[int, int], Pending] = {}  # (st_dev, st_ino) -> changes
            self.handles: dict[int, tuple[int, tuple[int, int]]] = {}  # fh -> (fd, key)
            self.next_fh = 1
            self.write_through = False
            self.max_pending = max_pending_bytes
            self.written_back = 0  # files written back early to bound memory
            # The slow-disk fault: each fsync waits a draw from this range (ms) first.
            self.fsync_delay_ms = (0.0, 0.0)
            self._delay_rng = random.Random()

        # ----- helpers -------------------------------------------------------------
        def _full(self, path: str) -> str:
            return self.root + path

        def _key_of_path(self, path: str) -> tuple[int, int] | None:
            try:
                st = os.lstat(self._full(path))
            except OSError:
                return None
            return (st.st_dev, st.st_ino)

        def _pending(self, fd: int, key: tuple[int, int]) -> Pending:
            found = self.pending.get(key)
            if found is None:
                found = self.pending[key] = Pending(os.dup(fd))
            return found

        def _drop(self, key: tuple[int, int] | None) -> None:
            found = self.pending.pop(key, None) if key is not None else None
            if found is not None:
                os.close(found.fd)

        def _sync(self, key: tuple[int, int]) -> None:
            found = self.pending.pop(key, None)
            if found is not None:
                try:
                    found.write_back()
                    os.fsync(found.fd)
                finally:
                    os.close(found.fd)

        def _bound_memory(self) -> None:
            while self.pending and sum(p.bytes for p in self.pending.values()) > self.max_pending:
                key = max(self.pending, key=lambda k: self.pending[k].bytes)
                found = self.pending.pop(key)
                found.write_back()
                os.close(found.fd)
                self.written_back += 1

        def flush_all(self) -> int:
            """Write every pending change back and fsync it; write through from now on."""
            with self._mutex:
                count = len(self.pending)
                for key in list(self.pending):
                    self._sync(key)
                self.write_through = True
                return count

        def stats(self) -> dict[str, Any]:
            with self._mutex:
                return {"files": len(self.pending),
                        "bytes": sum(p.bytes for p in self.pending.values()),
                        "written_back": self.written_back, "write_through": int(self.write_through),
                        "fsync_delay_ms": list(self.fsync_delay_ms)}

        # ----- metadata: straight through --------------------------------------------
        def getattr(self, path: str, fh: int | None = None) -> dict:
            with self._mutex:
                if fh is not None and fh in self.handles:
                    fd, key = self.handles[fh]
                    st = os.fstat(fd)
                else:
                    st = os.lstat(self._full(path))
                    key = (st.st_dev, st.st_ino)
                attrs = {name: getattr(st, name) for name in (
                    "st_mode", "st_nlink", "st_uid", "st_gid", "st_size", "st_blocks",
                    "st_atime_ns", "st_mtime_ns", "st_ctime_ns", "st_ino")}
                for name in ("st_atime", "st_mtime", "st_ctime"):
                    attrs[name] = attrs.pop(name + "_ns")
                found = self.pending.get(key)
                if found is not None and stat.S_ISREG(st.st_mode):
                    attrs["st_size"] = found.size
                return attrs

        def readdir(self, path: str, fh: int) -> list[str]:
            return [".", "..", *os.listdir(self._full(path))]

        def readlink(self, path: str) -> str:
            return os.readlink(self._full(path))

        def mkdir(self, path: str, mode: int) -> int:
            os.mkdir(self._full(path), mode)
            return 0

        def rmdir(self, path: str) -> int:
            os.rmdir(self._full(path))
            return 0

        def unlink(self, path: str) -> int:
            with self._mutex:
                st = os.lstat(self._full(path))
                os.unlink(self._full(path))
                if st.st_nlink <= 1:
                    self._drop((st.st_dev, st.st_ino))
            return 0

        def rename(self, old: str, new: str) -> int:
            with self._mutex:
                try:
                    replaced = os.lstat(self._full(new))
                except FileNotFoundError:
                    replaced = None
                os.rename(self._full(old), self._full(new))
                if replaced is not None and replaced.st_nlink <= 1:
                    self._drop((replaced.st_dev, replaced.st_ino))
            return 0

        def link(self, target: str, source: str) -> int:
            os.link(self._full(source), self._full(target))
            return 0

        def symlink(self, target: str, source: str) -> int:
            os.symlink(source, self._full(target))
            return 0

        def chmod(self, path: str, mode: int) -> int:
            os.chmod(self._full(path), mode)
            return 0

        def chown(self, path: str, uid: int, gid: int) -> int:
            os.chown(self._full(path), uid, gid)
            return 0

        def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
            os.utime(self._full(path), ns=times)
            return 0

        def access(self, path: str, amode: int) -> int:
            if not os.access(self._full(path), amode):
                raise mfusepy.FuseOSError(errno.EACCES)
            return 0

        def statfs(self, path: str) -> dict[str, int]:
            sv = os.statvfs(self._full(path))
            return {name: getattr(sv, name) for name in (
                "f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files",
                "f_ffree", "f_favail", "f_flag", "f_namemax")}

        def fsyncdir(self, path: str, datasync: int, fh: int) -> int:
            return 0  # metadata is not lazy (see the module's docstring)

        # ----- files: data held until fsync -----------------------------------------
        def _open_backing(self, full: str, flags: int) -> int:
            # Our descriptor reads and writes whatever the caller's flags: O_APPEND and
            # O_TRUNC are the kernel's and our business, not the backing file's.
            extra = flags & (os.O_CREAT | os.O_EXCL)
            try:
                return os.open(full, os.O_RDWR | extra, 0o644)
            except PermissionError:
                return os.open(full, os.O_RDONLY)

        def _register(self, fd: int) -> int:
            st = os.fstat(fd)
            fh = self.next_fh
            self.next_fh += 1
            self.handles[fh] = (fd, (st.st_dev, st.st_ino))
            return fh

        def create(self, path: str, mode: int, flags: int = 0) -> int:
            with self._mutex:
                existed = os.path.lexists(self._full(path))
                fd = os.open(self._full(path), os.O_RDWR | os.O_CREAT, mode)
                fh = self._register(fd)
                key = self.handles[fh][1]
                if not existed:
                    self._drop(key)  # a new inode may reuse a number we still remember
                if flags & os.O_TRUNC:
                    self._truncate_key(fd, key, 0)
                return fh

        def open(self, path: str, flags: int) -> int:
            with self._mutex:
                fd = self._open_backing(self._full(path), flags)
                fh = self._register(fd)
                if flags & os.O_TRUNC:
                    self._truncate_key(fd, self.handles[fh][1], 0)
                return fh

        def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
            with self._mutex:
                fd, key = self.handles[fh]
                found = self.pending.get(key)
                if found is None:
                    return os.pread(fd, size, offset)
                return found.read(size, offset)

        def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
            with self._mutex:
                fd, key = self.handles[fh]
                if self.write_through:
                    return os.pwrite(fd, data, offset)
                self._pending(fd, key).write(data, offset)
                self._bound_memory()
                return len(data)

        def _truncate_key(self, fd: int, key: tuple[int, int], length: int) -> None:
            if self.write_through:
                os.ftruncate(fd, length)
            else:
                self._pending(fd, key).truncate(length)

        def truncate(self, path: str, length: int, fh: int | None = None) -> int:
            with self._mutex:
                if fh is not None and fh in self.handles:
                    fd, key = self.handles[fh]
                    self._truncate_key(fd, key, length)
                    return 0
                if path is None:
                    raise mfusepy.FuseOSError(errno.EIO)
                fd = self._open_backing(self._full(path), 0)
                try:
                    self._truncate_key(fd, (os.fstat(fd).st_dev, os.fstat(fd).st_ino), length)
                finally:
                    os.close(fd)
                return 0

        def slow(self, low_ms: float, high_ms: float) -> None:
            if not 0 <= low_ms <= high_ms <= MAX_FSYNC_DELAY_MS:
                raise ValueError(f"fsync delay must be 0 <= low <= high <= "
                                 f"{MAX_FSYNC_DELAY_MS} ms, got {low_ms}..{high_ms}")
            self.fsync_delay_ms = (low_ms, high_ms)

        def fsync(self, path: str, datasync: int, fh: int) -> int:
            low, high = self.fsync_delay_ms
            if high > 0:  # a slow device: this fsync (and, one thread, all I/O) waits
                time.sleep(self._delay_rng.uniform(low, high) / 1000)
            with self._mutex:
                fd, key = self.handles[fh]
                self._sync(key)
                os.fsync(fd)
                return 0

        def release(self, path: str, fh: int) -> int:
            with self._mutex:
                fd, _ = self.handles.pop(fh)
                os.close(fd)  # closing makes nothing durable: the pending changes stay
                return 0

    return LazyLayer()


# ----- the control socket ----------------------------------------------------------------

def _serve_control(layer, path: str) -> None:  # noqa: ANN001
    """Answer `flush`, `stats` and `slow LOW_MS HIGH_MS` (each fsync then waits a uniform
    draw from that range first; `slow 0 0` restores) lines on a Unix socket, one
    connection at a time."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(4)

    def loop() -> None:
        while True:
            conn, _ = server.accept()
            with conn:
                try:
                    request = conn.makefile("r").readline().strip()
                    if request == "flush":
                        reply = f"ok {layer.flush_all()}\n"
                    elif request.startswith("slow "):
                        low, high = (float(x) for x in request.split()[1:3])
                        layer.slow(low, high)
                        reply = f"ok {low:g} {high:g}\n"
                    elif request == "stats":
                        reply = json.dumps(layer.stats()) + "\n"
                    else:
                        reply = f"error unknown request {request!r}\n"
                except Exception as exc:  # noqa: BLE001 - report, keep serving
                    reply = f"error {type(exc).__name__}: {exc}\n"
                with contextlib.suppress(OSError):
                    conn.sendall(reply.encode())

    threading.Thread(target=loop, name="lazyfs-control", daemon=True).start()


def request(control: str | os.PathLike, line: str, timeout_s: float = 60.0) -> str:
    """Send one request to a layer's control socket and return its one-line answer."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        sock.connect(str(control))
        sock.sendall(line.encode() + b"\n")
        reply = sock.makefile("r").readline().strip()
    if not reply or reply.startswith("error"):
        raise LazyFSError(f"the layer at {control} answered {reply or 'nothing'!r} to {line!r}")
    return reply


def _die_with_parent() -> None:
    """SIGTERM (a clean unmount) when the process named by PARENT_ENV dies."""
    parent = os.environ.get(PARENT_ENV)
    if not parent:
        return
    import ctypes
    import signal

    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    if os.getppid() != int(parent):
        sys.exit(0)


def mount(mountpoint: Path, backing: Path, control: str, max_pending_mb: int) -> None:
    """Mount the layer and serve it until SIGTERM/SIGINT (libfuse's handlers unmount)."""
    check_fuse()
    mfusepy = _operations_base()
    if not backing.is_dir():
        raise LazyFSError(f"the backing directory {backing} does not exist")
    if not mountpoint.is_dir():
        raise LazyFSError(f"the mount point {mountpoint} is not a directory")
    layer = make_layer(backing.resolve(), max_pending_mb * 1024 * 1024)
    _serve_control(layer, control)
    _die_with_parent()
    # Single-threaded: every operation takes the layer's lock anyway, and one thread keeps
    # libfuse's request order (a write is answered before the next one is read).
    mfusepy.FUSE(layer, str(mountpoint), foreground=True, nothreads=True, fsname=FSNAME,
                 subtype=FSNAME, hard_remove=True,
                 **({"allow_other": True} if os.geteuid() == 0 else {}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nemesis.lazyfs", description=(
        "A FUSE layer that keeps writes in memory until fsync (the lose-unsynced fault)."))
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("mount", help="mount over a backing directory (foreground)")
    m.add_argument("mountpoint", type=Path)
    m.add_argument("--backing", type=Path, required=True)
    m.add_argument("--control", required=True, help="Unix socket for flush/stats requests")
    m.add_argument("--max-pending-mb", type=int, default=DEFAULT_MAX_PENDING_MB)
    f = sub.add_parser("flush", help="write every pending change back; write through after")
    f.add_argument("control")
    s = sub.add_parser("stats", help="pending files and bytes, as JSON")
    s.add_argument("control")
    args = parser.parse_args(argv)
    try:
        if args.command == "mount":
            mount(args.mountpoint, args.backing, args.control, args.max_pending_mb)
        else:
            print(request(args.control, args.command))
        return 0
    except (LazyFSError, OSError) as exc:
        print(f"lazyfs: {exc}", file=sys.stderr)
        return 1
    except RuntimeError as exc:  # mfusepy: fuse_main failed; libfuse printed why above
        print(f"lazyfs: mounting {args.mountpoint} failed (libfuse exit {exc}); a container "
              f"needs --cap-add SYS_ADMIN, and apparmor=unconfined on AppArmor hosts",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
