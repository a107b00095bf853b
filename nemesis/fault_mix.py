"""`--faults all`: every kind of fault the platform can run, dealt from a deck.

Every kind in `faults.FAULTS` but `none`, minus those the platform cannot run (the
simulator has no node identity for `member` and no file bytes for the file faults; a
local run without FUSE has no lazy disk for `lose-unsynced`). Kinds are then dealt like
shapes and targets: each round deals every kind once in a shuffled order led by
`partition`, whose own deck leads with isolate-leader, and the first kill, pause and
member fault of each target round is aimed at the leader too.
"""

from __future__ import annotations

from nemesis.faults import FAULTS, LAZY_DISK_FAULTS, unsupported

ALL = "all"


def expand_all(platform: str) -> tuple[list[str], str]:
    """The kinds `--faults all` means on `platform`, and a one-line note of those left out
    and why ("" if none)."""
    kept, left = [], []
    for kind in FAULTS:
        if kind == "none":
            continue
        problem = unsupported([kind], platform)
        if problem is None and kind in LAZY_DISK_FAULTS and platform == "local":
            from nemesis import lazyfs

            if why := lazyfs.fuse_unavailable():
                problem = f"no lazy disk here: {why}"
        if problem is None:
            kept.append(kind)
        else:
            # unsupported() says "--faults X does not run on --platform P (why); use ...".
            reason = problem.split("(", 1)[1].split(")", 1)[0] if "(" in problem else problem
            left.append(f"{kind} ({reason})")
    note = (f"note: --faults all on --platform {platform} leaves out {'; '.join(left)}"
            if left else "")
    return kept, note
