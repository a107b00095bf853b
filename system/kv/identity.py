"""Who a data directory belongs to: its cluster, its node id, and its incarnation.

A node that lost its durable state is a new server (Raft thesis §4, §3.10): a voter that
comes back on an empty directory has forgotten the entries it acknowledged, and its vote
could elect a leader that lacks one of them. So every data directory records, in
`IDENTITY`:

- `cluster_id`: which cluster it belongs to (from `--cluster-id`, else derived from the
  bootstrap member ids, else learned from the peers when joining);
- `node_id`: the `--id` it was created for (another id is refused at start);
- `member_id`: a random id made when the directory was created: a wiped directory gets a
  new one, so the cluster can tell "n3 again" from "a new n3";
- `state`: "new" until the node has introduced itself to its peers (`Introduce`, see
  `system/kv/node.py`), then "member". A node whose state is "new" may not vote.

Each node also records, in `MEMBERS`, the member id under which it first heard from every
node id (`Introduce`). A node introducing itself under a new member id while a peer knows
its node id as a VOTER with another member id is refused a vote: it must rejoin through a
membership change (remove, add as a learner, catch up, promote).

The first start writes `IDENTITY` only after the storage created and synced its WAL, so a
directory with either file but no WAL lost its log: the storage refuses it
(system/kv/storage.py), as a node must never vote on a log shorter than what it
acknowledged.

Both files are written atomically (temporary file, fsync, rename, fsync of the directory)
and carry a CRC32C; damage is `CorruptStorage` naming the file. This module must never
guess an identity for a directory whose files are damaged.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

import crc32c

from system.kv.snapshot_file import fsync_directory
from system.kv.storage_errors import CorruptStorage

IDENTITY_FILE = "IDENTITY"
MEMBERS_FILE = "MEMBERS"
STATE_NEW = "new"
STATE_MEMBER = "member"


@dataclass(frozen=True)
class Identity:
    cluster_id: str
    node_id: str
    member_id: str
    state: str  # STATE_NEW or STATE_MEMBER


def derive_cluster_id(member_ids: list[str] | tuple[str, ...]) -> str:
    """A default cluster id from the bootstrap member ids (not their addresses: each node
    may reach its peers through its own proxies, so addresses differ between nodes). Two
    clusters with the same node ids get the same default: name them with --cluster-id."""
    text = ",".join(sorted(member_ids))
    return "c-" + hashlib.sha256(text.encode()).hexdigest()[:16]


def new_member_id() -> str:
    return "m-" + uuid.uuid4().hex[:16]


def _write_atomically(path: Path, body: dict) -> None:
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    record = json.dumps({"body": body, "crc32c": crc32c.crc32c(text.encode())}, sort_keys=True)
    temp = path.with_name(path.name + ".tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, (record + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temp, path)
    fsync_directory(path.parent)


def _read_checked(path: Path) -> dict | None:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        record = json.loads(raw.decode())
        body = record["body"]
        text = json.dumps(body, sort_keys=True, separators=(",", ":"))
        if crc32c.crc32c(text.encode()) != record["crc32c"]:
            raise ValueError("checksum mismatch")
        if not isinstance(body, dict):
            raise ValueError("not an object")
    except (UnicodeDecodeError, ValueError, KeyError, TypeError) as error:
        raise CorruptStorage(path, 0, f"unreadable {path.name} file: {error}") from None
    return body


def load_identity(data_dir: Path) -> Identity | None:
    """The directory's identity; None if it has none yet. CorruptStorage if damaged."""
    path = Path(data_dir) / IDENTITY_FILE
    body = _read_checked(path)
    if body is None:
        return None
    try:
        identity = Identity(**{k: str(body[k]) for k in ("cluster_id", "node_id", "member_id",
                                                          "state")})
    except KeyError as error:
        raise CorruptStorage(path, 0, f"{path.name} lacks the field {error}") from None
    if identity.state not in (STATE_NEW, STATE_MEMBER):
        raise CorruptStorage(path, 0, f"{path.name} has an unknown state {identity.state!r}")
    return identity


def save_identity(data_dir: Path, identity: Identity) -> None:
    _write_atomically(Path(data_dir) / IDENTITY_FILE, asdict(identity))


class KnownMembers:
    """node id -> the member id under which this node first heard from it (durable)."""

    def __init__(self, data_dir: Path) -> None:
        self.path = Path(data_dir) / MEMBERS_FILE
        body = _read_checked(self.path) or {}
        self._members = {str(k): str(v) for k, v in body.items()}

    def get(self, node_id: str) -> str | None:
        return self._members.get(node_id)

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._members

    def record(self, node_id: str, member_id: str) -> None:
        """Remember (durably, before returning) `node_id` as `member_id`."""
        if self._members.get(node_id) == member_id:
            return
        updated = dict(self._members)
        updated[node_id] = member_id
        _write_atomically(self.path, updated)
        self._members = updated
