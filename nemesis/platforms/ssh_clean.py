"""`python -m nemesis clean --hosts FILE`: remove what runs of the ssh platform left on the
hosts when their harness died without its tear-down (SIGKILL, a lost machine).

Every run folder on a host (/var/tmp/mao-*, `ssh.remote_dir`) holds `owner` (the harness
that made it: host, pid, process start) and `chain` (its iptables chain). A folder whose
harness still runs is left alone, as `clean` leaves a live run's containers alone, unless
`--run ID` names it.
"""

from __future__ import annotations

from pathlib import Path

from nemesis.platforms.docker import _owner_alive
from nemesis.platforms.ssh import REMOTE_ROOT, remote_dir, remove_script
from nemesis.platforms.ssh_conn import SshHosts
from nemesis.platforms.ssh_hosts import Host

LIST = (f"for d in {REMOTE_ROOT}/mao-*/; do [ -f \"$d/owner\" ] || continue; "
        f"printf '%s\\t%s\\t%s\\t%s\\n' \"${{d%/}}\" \"$(cat \"$d/owner\")\" "
        f"\"$(cat \"$d/chain\" 2>/dev/null)\" \"$(cat \"$d/comment\" 2>/dev/null)\"; done")


def clean_hosts(hosts: list[Host], run_id: str | None = None, *,
                known_hosts: Path | None = None, accept_new: bool = False) -> list[str]:
    """Remove the leftover runs on `hosts` (only `run_id`'s if given); what was removed."""
    removed: list[str] = []
    with SshHosts(hosts, known_hosts=known_hosts, accept_new=accept_new) as ssh:
        ssh.connect()
        listing = ssh.run_all({i: LIST for i in range(len(hosts))}, timeout_s=60)
        scripts: dict[int, str] = {}
        for i, (_, out) in listing.items():
            parts = []
            for line in out.splitlines():
                fields = line.split("\t")
                if len(fields) != 4 or not fields[0].startswith(f"{REMOTE_ROOT}/mao-"):
                    continue
                folder, owner, chain, comment = fields
                if run_id is not None and folder != remote_dir(run_id):
                    continue
                if run_id is None and _owner_alive(owner):
                    continue
                if chain.startswith("MAO-") and comment:
                    parts.append(remove_script(folder, chain, comment))
                    removed.append(f"{hosts[i].label()}: {folder} (its nodes and iptables "
                                   f"chain {chain})")
            if parts:
                scripts[i] = "; ".join(parts)
        if scripts:
            ssh.run_all(scripts, timeout_s=120)
    return removed
