"""The `run` and `inspect` commands: arguments, progress line, final table, one-line errors."""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any, Protocol

from tabulate import tabulate

from system.kv.tls import TlsError
from system.trainer.certs import add_arguments as add_tls_arguments
from system.trainer.config import DATASETS, ConfigError, TrainConfig

# Defaults per dataset that reach scikit-learn's accuracy (tests/trainer/test_trainer_math.py).
DATASET_DEFAULTS = {
    "breast_cancer": dict(batch_size=16, learning_rate=0.05),
    "digits_binary": dict(batch_size=32, learning_rate=0.05),
    "digits": dict(batch_size=32, learning_rate=0.05),
    "shuttle": dict(batch_size=64, learning_rate=0.1),
    "synthetic": dict(batch_size=256, learning_rate=0.05),
}


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--standbys", type=int, default=1)
    p.add_argument("--dataset", default="digits", help=", ".join(DATASETS))
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--checkpoint-every", type=int, default=100)
    p.add_argument("--checkpoint-store", default="inline", help="inline | object | s3://bucket/prefix")
    p.add_argument("--object-dir", default="trainer-objects",
                   help="directory of the local object store (--checkpoint-store object)")
    p.add_argument("--kv", default=None, help="store addresses host:port,...; default: start a local 3-node store")
    p.add_argument("--batch-size", type=int, default=None, help="rows per worker per step")
    p.add_argument("--learning-rate", type=float, default=None)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--l2", type=float, default=1e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rows", type=int, default=1_000_000, help="synthetic dataset rows")
    p.add_argument("--job", default="default")
    p.add_argument("--lease-s", type=float, default=2.0)
    p.add_argument("--gradient-deadline-s", type=float, default=5.0)
    p.add_argument("--run-dir", default=None, help="keep logs and event logs here")
    p.add_argument("--timeout-s", type=float, default=3600.0)
    p.add_argument("--tls", action="store_true",
                   help="mutual TLS with a throw-away CA made in the run directory for this run's "
                        "coordinators, workers and (without --kv) its store")
    p.add_argument("--kill-coordinator-at-step", type=int, default=None, metavar="N",
                   help="SIGKILL the active coordinator once it reaches step N (a standby "
                        "takes over); the table gives the kill-to-next-step time")
    p.add_argument("--compare-reference", action="store_true",
                   help="compare the final parameters bit for bit with the one-process "
                        "computation (always done with --hosts)")
    p.add_argument("--hosts", type=Path, default=None, metavar="FILE",
                   help="run the store (unless --kv), coordinators and workers on these SSH "
                        "hosts (the nemesis ssh platform's hosts file)")
    p.add_argument("--known-hosts", type=Path, default=None, metavar="FILE",
                   help="--hosts: the hosts' keys (default ~/.ssh/known_hosts)")
    p.add_argument("--accept-new-host-keys", action="store_true",
                   help="--hosts: trust a host the known_hosts file does not know yet")
    add_tls_arguments(p)


def add_inspect_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kv", required=True, help="store addresses host:port,...")
    p.add_argument("--job", default="default")
    add_tls_arguments(p)


def run_tls(args: argparse.Namespace):  # noqa: ANN201 - TrainerTls | None
    """`run`'s certificates: --tls (generated at start; a --kv store's own CA through
    --kv-cert-file ...), or one certificate for every process (--cert-file ...: a `node`
    certificate, since coordinators serve with it), or none."""
    from system.trainer.certs import TrainerTls, from_args

    own, kv = from_args(args, read=False)
    if args.tls:
        if own is not None:
            raise ConfigError("--tls makes this run's certificates: give the store's with "
                              "--kv-cert-file/--kv-key-file/--kv-trusted-ca-file, not --cert-file")
        if kv is not None and not args.kv:
            raise ConfigError("--kv-cert-file is for a store given with --kv; the store `run` "
                              "starts itself gets its certificates from --tls")
    elif kv is not None and own is None:
        raise ConfigError("--kv-cert-file needs --cert-file ... or --tls for the trainer's own traffic")
    elif own is not None and not args.kv:
        raise ConfigError("--cert-file is for a store given with --kv; the store `run` starts "
                          "itself gets its certificates from --tls")
    from_args(args)  # the combination is right: now the files themselves
    if args.tls:
        return TrainerTls(kv=kv) if kv is not None else None
    return TrainerTls(shared=own, kv=kv if kv is not own else None) if own is not None else None


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    defaults = DATASET_DEFAULTS.get(args.dataset, {})
    return TrainConfig(
        dataset=args.dataset, workers=args.workers, steps=args.steps,
        batch_size=args.batch_size or defaults.get("batch_size", 32),
        learning_rate=args.learning_rate or defaults.get("learning_rate", 0.05),
        momentum=args.momentum, l2=args.l2, seed=args.seed, synthetic_rows=args.rows,
        checkpoint_every=args.checkpoint_every, job=args.job)


def progress_line(status, steps: int, last: dict[str, float]) -> str:  # noqa: ANN001 - StatusReply
    """The progress line of an active coordinator's `status`. One that has just taken over
    has evaluated nothing yet (its loss and accuracy are NaN): the line keeps the last
    figures known (`last`, updated here), or `-` before there are any."""
    for name, value in (("loss", status.loss), ("acc", status.accuracy)):
        if not math.isnan(value):
            last[name] = value
    loss, acc = (f"{last[name]:.4f}" if name in last else "-" for name in ("loss", "acc"))
    bar = "#" * int(30 * status.step / steps)
    return (f"[{bar:<30}] step {status.step}/{steps} loss {loss} acc {acc} coordinator "
            f"{status.coordinator_id} (term {status.term}) checkpoint "
            f"@{status.last_checkpoint_step} v{status.last_checkpoint_version}")


def takeovers(events: list[dict]) -> int:
    """Lease acquisitions by a coordinator other than the lease's previous holder, in term
    order: the first acquisition of a run takes over from no one, and a coordinator that
    takes its own lapsed lease back takes over from no one either."""
    acquired = sorted((e for e in events if e.get("kind") == "lease-acquired"),
                      key=lambda e: (e.get("lease_version") or 0, e.get("time") or 0))
    return sum(a.get("coordinator_id") != b.get("coordinator_id")
               for a, b in zip(acquired, acquired[1:], strict=False))


def make_run(args: argparse.Namespace, config: TrainConfig,  # noqa: ANN201 - TrainerRun
             hosts: HostsSupport | None = None):
    """The TrainerRun of `run`'s arguments: on this machine, or on --hosts."""
    from system.trainer.run import TrainerRun

    if args.standbys < 0:
        raise ConfigError("--standbys must be 0 or more")
    if args.kill_coordinator_at_step is not None and args.standbys < 1:
        raise ConfigError("--kill-coordinator-at-step needs a standby to take over "
                          "(--standbys 1 or more)")
    if args.kill_coordinator_at_step is not None and not 0 < args.kill_coordinator_at_step < config.steps:
        raise ConfigError(f"--kill-coordinator-at-step must be from 1 to {config.steps - 1}")
    if args.hosts is None and (args.known_hosts is not None or args.accept_new_host_keys):
        raise ConfigError("--known-hosts and --accept-new-host-keys are for --hosts")
    tls = run_tls(args)
    kwargs = dict(standbys=args.standbys, kv=args.kv.split(",") if args.kv else None,
                  checkpoint_store=args.checkpoint_store,
                  run_dir=Path(args.run_dir) if args.run_dir else None,
                  lease_s=args.lease_s, gradient_deadline_s=args.gradient_deadline_s,
                  object_dir=Path(args.object_dir).resolve(), tls=tls, generate_tls=args.tls)
    if args.hosts is None:
        return TrainerRun(config, **kwargs)
    if hosts is None:
        raise ConfigError("--hosts needs the harness's SSH platform (the nemesis package), "
                          "which this installation lacks")
    if args.known_hosts is not None and not args.known_hosts.is_file():
        raise ConfigError(f"--known-hosts {args.known_hosts} does not exist")
    return hosts.make_run(config, args.hosts, args.known_hosts, args.accept_new_host_keys,
                          **kwargs)


class HostsSupport(Protocol):
    """How `run --hosts` reaches other machines: the harness's SSH platform
    (nemesis/trainer_hosts.py), handed in by the entry point (`python -m system.trainer`), so
    the system never imports the harness that tests it."""

    errors: tuple[type[Exception], ...]  # a host failed: exit 1, not a settings error

    def make_run(self, config: TrainConfig, hosts_file: Path, known_hosts: Path | None,
                 accept_new: bool, **kwargs: Any) -> Any: ...


class CoordinatorKill:
    """--kill-coordinator-at-step: SIGKILL the active coordinator once its Status says step
    N or later, then time until another coordinator's Status shows a step past the one it
    resumed at (what the workers wait through: lease expiry, takeover, resume, one step),
    as the harness sees it: within one poll (0.1 s and a Status round trip)."""

    def __init__(self, at_step: int | None) -> None:
        self.at_step = at_step
        self.victim: str | None = None
        self.killed_step = 0
        self.killed_at = 0.0
        self.resumed_step: int | None = None  # the successor's step when first seen
        self.takeover_s: float | None = None

    def pending(self) -> bool:
        return self.at_step is not None and (self.victim is None or self.takeover_s is None)

    def check(self, run) -> None:  # noqa: ANN001 - TrainerRun
        st = run.status()
        if st is None or not st.active:
            return
        if self.victim is None and st.step >= self.at_step:
            self.victim, self.killed_step = st.coordinator_id, st.step
            self.killed_at = time.monotonic()
            run.kill(self.victim)
            print(f"killed the active coordinator {self.victim} at step {st.step}",
                  file=sys.stderr, flush=True)
        elif self.victim is not None and st.coordinator_id != self.victim:
            if self.resumed_step is None:
                self.resumed_step = st.step
            elif st.step > self.resumed_step:
                self.takeover_s = time.monotonic() - self.killed_at

    def rows(self) -> list[tuple[str, object]]:
        if self.at_step is None:
            return []
        took = f"{self.takeover_s:.2f}" if self.takeover_s is not None else "not seen"
        resumed = f", successor first seen at step {self.resumed_step}" if self.resumed_step is not None else ""
        return [("coordinator killed", f"{self.victim} at step {self.killed_step}{resumed}"),
                ("kill -> next coordinator's first step, s", took)]


def reference_row(config: TrainConfig, params) -> tuple[str, str]:  # noqa: ANN001 - ndarray
    """The final parameters against the one-process computation (system/trainer/local.py),
    bit for bit."""
    import numpy as np

    from system.trainer.local import train_local

    expected = train_local(config).params
    if params.shape == expected.shape and params.tobytes() == expected.tobytes():
        return ("vs one-process reference", "bit-for-bit equal")
    differ = (int(np.count_nonzero(params != expected)) if params.shape == expected.shape
              else params.size)
    return ("vs one-process reference", f"DIFFERS ({differ} of {expected.size} values)")


def run_command(args: argparse.Namespace, hosts: HostsSupport | None = None) -> int:
    from system.trainer import data, model
    from system.trainer.checkpoint import CheckpointError
    from system.trainer.run import RunTimeout

    host_errors = hosts.errors if hosts is not None else ()
    try:
        config = config_from_args(args)
        config.validate()
        run = make_run(args, config, hosts)
    except (ConfigError, TlsError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    tty = sys.stderr.isatty()
    killer = CoordinatorKill(args.kill_coordinator_at_step)
    code = 0
    try:
        run.start()
        last_line = 0.0
        figures: dict[str, float] = {}  # the last loss and accuracy known

        def progress() -> bool:
            nonlocal last_line
            if run.finished():
                return True
            error = run.config_error()
            if error:
                raise ConfigError(error)
            if killer.pending():
                killer.check(run)
            now = time.monotonic()
            if now - last_line >= (0.5 if tty else 5.0):
                last_line = now
                st = run.status()
                if st is not None and st.active:
                    line = progress_line(st, config.steps, figures)
                    print(("\r" + line) if tty else line, end="" if tty else "\n", file=sys.stderr,
                          flush=True)
            return False

        run.wait_until(progress, args.timeout_s, "the run to finish", poll_s=0.1)
        if tty:
            print(file=sys.stderr)
        latest = run.latest_checkpoint()
        assert latest is not None
        ds = data.load(config)
        params = latest.checkpoint.params
        elapsed = time.monotonic() - run.started_at
        events = run.events()
        rows = [
            ("dataset", f"{config.dataset} ({len(ds.y_train)} train / {len(ds.y_test)} test rows)"),
            ("steps", latest.checkpoint.step),
            ("held-out accuracy", f"{model.accuracy(params, ds.x_test, ds.y_test):.4f}"),
            ("held-out loss", f"{model.loss(params, ds.x_test, ds.y_test, config.l2):.4f}"),
            ("checkpoints committed", sum(e.get("kind") == "checkpoint-ok" for e in events)),
            ("coordinator takeovers", takeovers(events)),
            ("skipped gradients", sum(e.get("kind") == "skip" for e in events)),
            ("final checkpoint", f"version {latest.version}, {latest.meta.checksum[:23]}"),
            ("wall time, s", f"{elapsed:.1f}"),
            ("samples/s", f"{config.steps * config.workers * config.batch_size / elapsed:,.0f}"),
            *killer.rows(),
        ]
        if args.compare_reference or args.hosts is not None:
            rows.append(reference_row(config, params))
            code = 0 if rows[-1][1] == "bit-for-bit equal" else 1
        print(tabulate(rows, tablefmt="simple"))
        return code
    except (ConfigError, CheckpointError, TlsError, *host_errors) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1 if isinstance(exc, host_errors) else 2  # a host, not the settings
    except RunTimeout as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ninterrupted; every committed checkpoint stays in the store", file=sys.stderr)
        return 130
    finally:
        try:
            run.close()
        except host_errors as exc:  # the hosts could not all be cleaned: say so
            print(f"error: {exc}", file=sys.stderr)


def inspect_command(args: argparse.Namespace) -> int:
    from system.kv.client import KVClient, KVError
    from system.trainer.certs import from_args
    from system.trainer.checkpoint_store import CheckpointStore
    from system.trainer.lease import read_lease

    try:
        _, kv_tls = from_args(args)
    except TlsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    kv = KVClient(args.kv.split(","), timeout_s=5.0, tls=kv_tls)
    try:
        store = CheckpointStore(kv, args.job)
        head = store.read_head()
        lease, lease_version = read_lease(kv, args.job)
    except KVError as exc:
        print(f"error: cannot read job {args.job!r} from {args.kv}: {str(exc).splitlines()[0][:400]}",
              file=sys.stderr)
        return 2
    finally:
        kv.close()
    if head is None:
        print(f"error: no checkpoint for job {args.job!r} in this store", file=sys.stderr)
        return 1
    meta, _, version = head
    entries = [*meta.history, meta.summary(version)]
    rows = [(e.get("version"), e["kind"], e["step"], e["coordinator_id"], e["lease_version"],
             e["request_id"], e["mode"], e["size"], (e.get("checksum") or "")[:19],
             e.get("pointer") and e["pointer"][:19] or (f"{len(e['chunks'])} chunks" if e.get("chunks") else "inline"))
            for e in entries]
    print(tabulate(rows, headers=["version", "kind", "step", "coordinator", "lease", "request id",
                                  "mode", "bytes", "checksum", "blob"]))
    if lease is not None:
        print(f"\nlease: {lease.coordinator_id} at {lease.address}, term {lease.term}, "
              f"version {lease_version}{', done' if lease.done else ''}")
    return 0
