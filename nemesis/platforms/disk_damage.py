"""Damage to the data directories of stopped nodes: list their files, truncate one, flip bits
in one, remove the WAL folder. The file faults (`truncate`, `bitflip`, `wipe-wal`) of
`nemesis.faults` decide what to damage; this module only does it and says what it found.

Standard library only, and runnable as a script (`python3 -c SOURCE REQUEST_JSON`, the answer
as one JSON line on stdout): the docker platform runs this same code in a short-lived helper
container with the nodes' volumes mounted, so both platforms damage files the same way.

A request names data directories by node id: {"op": "list"|"damage", "dirs": {node: path},
"damage": {node: [damage, ...]}, "layout": LAYOUT}. LAYOUT says where the system keeps its
files (nemesis/systems/base.py `DataLayout.as_request`): {"wal": [folder, suffix],
"snapshots": [folder, suffix] or null, "preallocated": bool}; without it, the store's
(`STORE_LAYOUT`). A damage is a dict:
  {"kind": "truncate", "file": "wal/0000000000000001.wal", "size": N}   cut the file to N bytes
  {"kind": "flip", "file": ..., "flips": [[offset, bit], ...]}         flip those bits
  {"kind": "remove-wal"}                                     delete the layout's WAL folder
Files are named relative to the data directory and must stay inside it.
"""

from __future__ import annotations

import json
import os
import shutil
import sys

STORE_LAYOUT = {"wal": ["wal", ".wal"], "snapshots": ["snapshots", ".snap"], "preallocated": True}


def list_files(data_dir: str, layout: dict | None = None) -> dict[str, int]:
    """{"<wal folder>/<segment>": written end, "<snapshot folder>/<name>": size} in name
    order (see `_written_end`: a preallocated segment is larger than what was written)."""
    layout = layout or STORE_LAYOUT
    found: dict[str, int] = {}
    kinds = [(layout["wal"], True)] + ([(layout["snapshots"], False)] if layout.get("snapshots") else [])
    for (sub, suffix), is_wal in kinds:
        folder = os.path.join(data_dir, sub)
        if not os.path.isdir(folder):
            continue
        for name in sorted(os.listdir(folder)):
            path = os.path.join(folder, name)
            if name.endswith(suffix) and os.path.isfile(path):
                size = os.path.getsize(path)
                preallocated = is_wal and layout.get("preallocated", True)
                found[f"{sub}/{name}"] = _written_end(path, size) if preallocated else size
    return found


def _written_end(path: str, size: int) -> int:
    """Where the written part of a WAL segment ends. Segments are preallocated (sparse, at
    their full size), so damage drawn over the whole file would nearly always land in the
    never-written tail; cuts and flips are drawn below this instead. The end of the last
    data extent (SEEK_DATA / SEEK_HOLE); the whole size where the file system cannot tell."""
    end = offset = 0
    fd = os.open(path, os.O_RDONLY)
    try:
        while offset < size:
            try:
                start = os.lseek(fd, offset, os.SEEK_DATA)
            except OSError:  # ENXIO: no data after offset
                break
            offset = end = os.lseek(fd, start, os.SEEK_HOLE)
    except OSError:
        return size
    finally:
        os.close(fd)
    return max(1, min(end, size)) if size else 0


def _inside(data_dir: str, name: str) -> str:
    root = os.path.realpath(data_dir)
    path = os.path.realpath(os.path.join(root, name))
    if not path.startswith(root + os.sep):
        raise ValueError(f"{name!r} is not inside the data directory {data_dir}")
    return path


def _sync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def apply(data_dir: str, damages: list[dict], layout: dict | None = None) -> list[dict]:
    """Do each damage in order; return, for each, what the file looked like before and after."""
    layout = layout or STORE_LAYOUT
    wal_dir = layout["wal"][0]
    done = []
    for damage in damages:
        kind = damage["kind"]
        if kind == "remove-wal":
            folder = _inside(data_dir, wal_dir)
            removed = {f: s for f, s in list_files(data_dir, layout).items()
                       if f.startswith(wal_dir + "/")}
            shutil.rmtree(folder, ignore_errors=True)
            done.append({"kind": kind, "removed": removed, "bytes": sum(removed.values())})
            continue
        path = _inside(data_dir, damage["file"])
        before = os.path.getsize(path)
        if kind == "truncate":
            size = int(damage["size"])
            if not 0 <= size < before:
                raise ValueError(f"cannot cut {damage['file']} ({before} bytes) to {size} bytes")
            os.truncate(path, size)
        elif kind == "flip":
            with open(path, "r+b") as f:
                for offset, bit in damage["flips"]:
                    if not 0 <= offset < before or not 0 <= bit < 8:
                        raise ValueError(f"no bit {bit} at offset {offset} of {damage['file']} "
                                         f"({before} bytes)")
                    f.seek(offset)
                    byte = f.read(1)[0]
                    f.seek(offset)
                    f.write(bytes([byte ^ (1 << bit)]))
        else:
            raise ValueError(f"unknown damage {kind!r}")
        _sync(path)
        done.append({**damage, "size_before": before, "size_after": os.path.getsize(path)})
    return done


def handle(request: dict) -> dict:
    dirs: dict[str, str] = request["dirs"]
    layout = request.get("layout")
    if request["op"] == "list":
        return {node: list_files(path, layout) for node, path in dirs.items()}
    return {node: apply(dirs[node], damages, layout)
            for node, damages in request["damage"].items()}


def main(argv: list[str]) -> int:
    try:
        answer = {"ok": handle(json.loads(argv[1]))}
    except (OSError, ValueError, KeyError, IndexError) as exc:
        answer = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(answer))
    return 0 if "ok" in answer else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
