"""The node image of the Docker platform, built offline in three cached layers.

No registry can be reached from the machines this runs on, so nothing is pulled:

1. `mao-base:<hash>`: a Debian root filesystem made by `debootstrap --variant=minbase
   --include=python3,iptables,iproute2,procps,fuse3,etcd-server bookworm` (fuse3 brings
   libfuse 3, which the lazy disk of `lazy_disk` runs on; etcd-server brings /usr/bin/etcd
   3.4, the node of `--system etcd`), from the machine's own apt mirror,
   imported as an image. The tarball is also kept in the cache directory
   (`~/.cache/many-as-one/`, or `$MAO_CACHE_DIR`) so a deleted image is re-imported in
   seconds without debootstrap. The hash covers the suite, variant and package list (not the
   mirror: any mirror of the suite gives the same system).
2. `mao-deps:<hash>`: the node's runtime dependencies (NODE_PACKAGES, as pinned in `[project] dependencies` of
   pyproject.toml and what they require, at the versions installed on this host) from
   cp311 manylinux wheels downloaded on the host (`pip download`; a package published only
   as an sdist is built into a pure-Python wheel with `pip wheel`). The image has no pip:
   pip runs from its own wheel file and installs into /opt/mao/deps. The hash covers the
   pinned versions.
3. `mao-node:<hash>`: the sources the node runs (`system/`, `histories/`, and the lazy disk
   `nemesis/lazyfs.py`, which runs in the container beside the node) in /opt/mao/src,
   checked at build time by importing the node's and the trainer's modules, and the
   trainer's bundled dataset files (`system.trainer.data.BUNDLED_FILES`, copied from the
   host's scikit-learn and river into /opt/mao/data/<package>/..., last on PYTHONPATH:
   the image has neither package, and `find_spec` resolves those directories as namespace
   packages, which is all the trainer's data loader asks of them) — the trainer's
   coordinators and workers run in this image too. The hash covers those files and the
   deps tag.

Each level is rebuilt only when its own inputs changed. Images carry the labels
`mao.project=many-as-one` and `mao.kind=base|deps|node`; they are the cache and are not
removed after a run (`remove_images()`, i.e. `python -m nemesis clean --images`, removes
them). `python -m nemesis.platforms.image` builds the image and prints its tag (CI step).

Every stage says what it does while it does it (`build_progress.py`: the tool's phases, and
`still building: <stage>, N s` when it is quiet), and apt-get first waits, saying so, for a
package-manager lock another process holds (`apt_lock.py`).

What it must never do: pull from a registry, or leave a half-made tarball or a temporary
build directory behind.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path

from nemesis.platforms import apt_lock
from nemesis.platforms.base import PlatformError, PlatformUnavailable
from nemesis.platforms.build_progress import Stage, docker_steps, stream

REPO_ROOT = Path(__file__).resolve().parents[2]

LABEL_PROJECT = "mao.project"
PROJECT = "many-as-one"
LABEL_KIND = "mao.kind"

SUITE = "bookworm"
VARIANT = "minbase"
PACKAGES = ("python3", "iptables", "iproute2", "procps", "fuse3", "etcd-server")
DEFAULT_MIRROR = "http://deb.debian.org/debian"
IMAGE_PYTHON = ("3.11", "cp311")  # bookworm's python3 is 3.11.2
# bookworm has glibc 2.36: any manylinux wheel up to 2_36 runs there.
WHEEL_PLATFORMS = ("manylinux_2_36_x86_64", "manylinux_2_28_x86_64", "manylinux_2_17_x86_64",
                   "manylinux2014_x86_64")
SOURCE_DIRS = ("system", "histories")  # what the node imports (checked at build time)
SOURCE_FILES = ("nemesis/__init__.py", "nemesis/lazyfs.py")  # the lazy disk (lazy_disk)
NODE_IMPORT_CHECK = ("import system.kv.__main__, system.kv.node, system.kv.server, system.kv.client, "
                     "system.trainer.__main__, system.trainer.cli, system.trainer.coordinator, "
                     "system.trainer.worker; from system.trainer.data import _raw; "
                     "_raw(\"breast_cancer\"); "  # the nemesis workload's dataset is readable
                     "import nemesis.lazyfs; nemesis.lazyfs._operations_base()")  # finds libfuse 3
DATA_DIR = "/opt/mao/data"  # the trainer's dataset files in the image
LAYOUT_VERSION = "2"  # bump when the Dockerfiles below change
# What a first build was measured to take, with its conditions (docs/nemesis.md, "Image").
FIRST_BUILD_MEASURED = ("2-5 min: measured 113 s at load average 5-7 and 279 s at load 2-23 "
                        "on 2 cores, most of it debootstrap and the dependency layer; a busy "
                        "machine or a slow mirror takes longer")

Log = Callable[[str], None]


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def load_conditions() -> str:
    """The machine's load now, as a build time's condition: `load average 3.1 (1 min),
    2.4 (5 min) on 2 cores`."""
    try:
        one, five, _ = os.getloadavg()
    except OSError:
        return f"{os.cpu_count()} cores, load unknown"
    return f"load average {one:.1f} (1 min), {five:.1f} (5 min) on {os.cpu_count()} cores"


def cache_dir() -> Path:
    """Where the rootfs tarball and the wheels are kept between runs."""
    if os.environ.get("MAO_CACHE_DIR"):
        return Path(os.environ["MAO_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "many-as-one"


def _hash(obj: object) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:12]


# ----- level 1: the Debian base ----------------------------------------------------------

def apt_mirror() -> str:
    """The Debian mirror this machine's apt uses (deb822 `URIs:` or sources.list), else
    deb.debian.org. Security and other archives are skipped."""
    candidates: list[str] = []
    for path in sorted(Path("/etc/apt/sources.list.d").glob("*.sources")):
        with contextlib.suppress(OSError):
            for line in path.read_text().splitlines():
                if line.strip().lower().startswith("uris:"):
                    candidates.extend(line.split(":", 1)[1].split())
    with contextlib.suppress(OSError):
        for line in Path("/etc/apt/sources.list").read_text().splitlines():
            parts = line.split()
            if parts and parts[0] == "deb":
                urls = [p for p in parts[1:] if "://" in p]
                candidates.extend(urls[:1])
    for url in candidates:
        if "security" not in url and "://" in url:
            return url.rstrip("/")
    return DEFAULT_MIRROR


def base_tag() -> str:
    return "mao-base:" + _hash({"suite": SUITE, "variant": VARIANT, "packages": sorted(PACKAGES),
                                "layout": LAYOUT_VERSION})


DEBOOTSTRAP_FALLBACK = Path("/usr/sbin/debootstrap")  # root's PATH has it, a user's may not


def _ensure_debootstrap(log: Log) -> str:
    found = shutil.which("debootstrap") or (
        str(DEBOOTSTRAP_FALLBACK) if DEBOOTSTRAP_FALLBACK.exists() else None)
    if found:
        return found
    if os.geteuid() != 0:
        raise PlatformUnavailable("debootstrap is missing and installing it needs root: run "
                                  "`sudo apt-get install -y debootstrap`, then build again.")
    log("  debootstrap is not installed: installing it with `apt-get install -y debootstrap`")
    t0 = time.monotonic()
    # Another process may hold the package manager's lock: wait for it (bounded), saying so.
    deadline = t0 + apt_lock.APT_LOCK_WAIT_S
    install = ["install", "-y", "debootstrap"]
    if not apt_lock.apt_get(install, log, deadline, check=False):
        apt_lock.apt_get(["update"], log, deadline)
        apt_lock.apt_get(install, log, deadline)
    log(f"  installed debootstrap ({time.monotonic() - t0:.1f} s)")
    return shutil.which("debootstrap") or str(DEBOOTSTRAP_FALLBACK)


def _stage_run(cmd: list[str], what: str, log: Log, **stage: object) -> None:
    """`cmd` with its output condensed on `log` as stage `what` (build_progress.py);
    PlatformUnavailable with its last output if it fails."""
    with Stage(what, log, **stage) as progress:  # type: ignore[arg-type]
        code, tail = stream(cmd, progress)
    if code != 0:
        raise PlatformUnavailable(f"{what} failed (exit {code}): `{' '.join(cmd)}`; "
                                  f"its last output:\n" + "\n".join(tail))


def rootfs_tarball(log: Log = _stderr) -> Path:
    """The cached rootfs tarball of the base image, made with debootstrap if absent."""
    tag = base_tag()
    tarball = cache_dir() / f"rootfs-{tag.split(':')[1]}.tar"
    if tarball.exists():
        return tarball
    if os.geteuid() != 0:
        raise PlatformUnavailable("building the base image runs debootstrap, which needs root; "
                                  "run `python -m nemesis.platforms.image` once as root.")
    debootstrap = _ensure_debootstrap(log)
    mirror = apt_mirror()
    tarball.parent.mkdir(parents=True, exist_ok=True)
    log(f"  debootstrap {SUITE} ({VARIANT}, +{','.join(PACKAGES)}) from {mirror} ...")
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="rootfs-", dir=tarball.parent) as tmp:
        root = Path(tmp) / "root"
        _stage_run([debootstrap, f"--variant={VARIANT}", f"--include={','.join(PACKAGES)}",
                    SUITE, str(root), mirror], "debootstrap", log)
        # Downloaded .debs and apt lists are not needed in the image.
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for entry in (root / junk).glob("*"):
                if entry.is_file():
                    entry.unlink()
        log(f"  debootstrap done ({time.monotonic() - t0:.1f} s); packing {tarball.name}")
        partial = Path(tmp) / "rootfs.tar"
        _stage_run(["tar", "--numeric-owner", "--xattrs", "-C", str(root), "-cf", str(partial),
                    "--exclude=./dev/*", "--exclude=./proc/*", "--exclude=./sys/*", "."],
                   "packing the root filesystem", log)
        partial.replace(tarball)
    return tarball


def _image_exists(client, tag: str) -> bool:  # noqa: ANN001 - docker.DockerClient
    import docker.errors

    try:
        client.images.get(tag)
        return True
    except docker.errors.ImageNotFound:
        return False


def ensure_base(client, log: Log = _stderr) -> str:  # noqa: ANN001
    tag = base_tag()
    if _image_exists(client, tag):
        return tag
    tarball = rootfs_tarball(log)
    t0 = time.monotonic()
    log(f"  importing {tarball} as {tag} ...")
    repo, version = tag.split(":")
    with Stage(f"importing {tarball.name}", log):
        client.api.import_image(
            src=str(tarball), repository=repo, tag=version,
            changes=[f"LABEL {LABEL_PROJECT}={PROJECT}", f"LABEL {LABEL_KIND}=base",
                     "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                     "ENV LANG=C.UTF-8"])
    if not _image_exists(client, tag):
        raise PlatformUnavailable(f"importing {tarball} as {tag} did not create the image; "
                                  f"delete {tarball} and build again.")
    size = tarball.stat().st_size / 1e6
    log(f"  imported {tarball.name} ({size:.0f} MB) as {tag} ({time.monotonic() - t0:.1f} s)")
    return tag


# ----- level 2: the Python dependencies --------------------------------------------------

def _requirement_api():  # noqa: ANN202
    try:
        from packaging.requirements import Requirement
        from packaging.utils import canonicalize_name
    except ImportError:  # pip always carries it
        from pip._vendor.packaging.requirements import Requirement  # type: ignore[no-redef]
        from pip._vendor.packaging.utils import canonicalize_name  # type: ignore[no-redef]
    return Requirement, canonicalize_name


# What the node process (`python -m system.kv serve`) imports beyond the standard library;
# the build imports the node's modules in the image, so a missing one fails the build. The
# harness's own dependencies (matplotlib, scikit-learn, ...) stay out of the image.
# The trainer's coordinators and workers (`python -m system.trainer`) need numpy,
# threadpoolctl and tabulate (its CLI) besides; the lazy disk (`nemesis.lazyfs`) mfusepy;
# every node cryptography (system/kv/tls.py, imported by the node whether or not it runs TLS).
NODE_PACKAGES = ("grpcio", "protobuf", "crc32c", "numpy", "threadpoolctl", "tabulate", "mfusepy",
                 "cryptography")


def runtime_requirements() -> list[str]:
    """The requirement lines of pyproject.toml for the packages the node needs."""
    Requirement, canonicalize_name = _requirement_api()
    with open(REPO_ROOT / "pyproject.toml", "rb") as f:
        lines = list(tomllib.load(f)["project"]["dependencies"])
    wanted = {canonicalize_name(n) for n in NODE_PACKAGES}
    chosen = [line for line in lines if canonicalize_name(Requirement(line).name) in wanted]
    missing = wanted - {canonicalize_name(Requirement(line).name) for line in chosen}
    if missing:
        raise PlatformUnavailable(f"pyproject.toml no longer lists {', '.join(sorted(missing))}, "
                                  f"which the node image needs")
    return chosen


def dependency_pins() -> list[str]:
    """`name==version` for the runtime dependencies and everything they need, as installed
    on this host (the image gets exactly what the host runs the harness with)."""
    Requirement, canonicalize_name = _requirement_api()
    pins: dict[str, str] = {}
    todo = list(runtime_requirements())
    while todo:
        req = Requirement(todo.pop())
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(req.name)
        if name in pins:
            continue
        try:
            dist = importlib.metadata.distribution(req.name)
        except importlib.metadata.PackageNotFoundError:
            raise PlatformUnavailable(
                f"the dependency {req.name} is not installed on this host, so its version for "
                f"the image is unknown; run `python3 -m pip install -e .` first.") from None
        pins[name] = dist.version
        for sub in dist.requires or []:
            sub_req = Requirement(sub)
            if sub_req.marker is None or sub_req.marker.evaluate({"extra": ""}):
                todo.append(sub)
    return sorted(f"{n}=={v}" for n, v in pins.items())


def _pip_pin() -> str:
    return f"pip=={importlib.metadata.version('pip')}"


def deps_tag(pins: list[str] | None = None) -> str:
    pins = dependency_pins() if pins is None else pins
    return "mao-deps:" + _hash({"pins": pins, "pip": _pip_pin(), "python": IMAGE_PYTHON,
                                "base": base_tag(), "layout": LAYOUT_VERSION})


def _pip(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args],
                          capture_output=True, text=True)


def _wheel_names(directory: Path) -> set[str]:
    _, canonicalize_name = _requirement_api()
    return {canonicalize_name(p.name.split("-")[0]) for p in directory.glob("*.whl")}


def download_wheels(pins: list[str], directory: Path, log: Log = _stderr) -> None:
    """cp311 manylinux (or pure) wheels of `pins` and of pip itself into `directory`."""
    _, canonicalize_name = _requirement_api()
    directory.mkdir(parents=True, exist_ok=True)
    wanted = [*pins, _pip_pin()]
    missing = [p for p in wanted if canonicalize_name(p.split("==")[0]) not in _wheel_names(directory)]
    if not missing:
        return
    platform_args = [a for plat in WHEEL_PLATFORMS for a in ("--platform", plat)]
    binary = ["download", "--no-deps", "--only-binary=:all:", *platform_args,
              "--python-version", IMAGE_PYTHON[0], "--implementation", "cp",
              "--abi", IMAGE_PYTHON[1], "--abi", "abi3", "--abi", "none", "-d", str(directory)]
    proc = _pip([*binary, *missing])
    if proc.returncode != 0:  # one of them has no such wheel: go one by one
        for pin in missing:
            if canonicalize_name(pin.split("==")[0]) in _wheel_names(directory):
                continue
            if _pip([*binary, pin]).returncode == 0:
                continue
            # Published as an sdist only: build a wheel here; it must be pure Python.
            built = _pip(["wheel", "--no-deps", "-w", str(directory), pin])
            if built.returncode != 0:
                raise PlatformUnavailable(
                    f"no cp311 manylinux wheel of {pin} could be downloaded or built "
                    f"(is PyPI reachable?): {built.stderr.strip().splitlines()[-1:]}")
            name = canonicalize_name(pin.split("==")[0])
            for whl in directory.glob("*.whl"):
                if canonicalize_name(whl.name.split("-")[0]) == name and not whl.name.endswith(
                        "-none-any.whl"):
                    raise PlatformUnavailable(f"{pin} has no manylinux wheel and building it "
                                              f"here gave a platform wheel {whl.name}.")
            log(f"  {pin}: no wheel published, built a pure-Python wheel from its sdist")
    still = [p for p in wanted if canonicalize_name(p.split("==")[0]) not in _wheel_names(directory)]
    if still:
        raise PlatformUnavailable(f"could not get wheels for {', '.join(still)}")


def _build(client, context: Path, tag: str, kind: str, inputs: str,  # noqa: ANN001
           log: Log = _stderr) -> None:
    """`docker build` of `context` (never pulls: FROM names a local image), its steps and
    a `still building` line while one runs on `log`."""
    repo, version = tag.split(":")
    lines: list[str] = []
    error = None
    with Stage(f"docker build {tag}", log, phase=docker_steps) as stage:
        for chunk in client.api.build(path=str(context), tag=tag, rm=True, forcerm=True,
                                      pull=False, decode=True,
                                      labels={LABEL_PROJECT: PROJECT, LABEL_KIND: kind,
                                              "mao.inputs": inputs}):
            if "stream" in chunk:
                for line in chunk["stream"].rstrip().splitlines():
                    lines.append(line)
                    stage.output(line)
            if "error" in chunk:
                error = chunk["error"]
    if error is not None or not _image_exists(client, tag):
        tail = "\n".join(lines[-20:])
        raise PlatformUnavailable(f"docker build of {tag} failed: {error}\n{tail}")


def ensure_deps(client, log: Log = _stderr) -> str:  # noqa: ANN001
    pins = dependency_pins()
    tag = deps_tag(pins)
    if _image_exists(client, tag):
        return tag
    base = ensure_base(client, log)
    wheels = cache_dir() / f"wheels-{tag.split(':')[1]}"
    t0 = time.monotonic()
    log(f"  wheels of {len(pins)} runtime dependencies ({', '.join(pins)}) into {wheels} ...")
    with Stage("downloading wheels", log):
        download_wheels(pins, wheels, log)
    log(f"  wheels ready ({time.monotonic() - t0:.1f} s)")
    t0 = time.monotonic()
    log(f"  building {tag}: pip install of the wheels into /opt/mao/deps ...")
    pip_whl = next(p.name for p in wheels.glob("pip-*.whl"))
    with tempfile.TemporaryDirectory(prefix="mao-deps-ctx-") as tmp:
        ctx = Path(tmp)
        shutil.copytree(wheels, ctx / "wheels")
        (ctx / "requirements.txt").write_text("\n".join(pins) + "\n")
        (ctx / "Dockerfile").write_text(
            f"FROM {base}\n"
            "COPY wheels /tmp/wheels\n"
            "COPY requirements.txt /tmp/requirements.txt\n"
            # pip runs from its own wheel (the image has none); --target keeps the system
            # Python untouched (bookworm marks it externally managed).
            f"RUN python3 /tmp/wheels/{pip_whl}/pip install --disable-pip-version-check "
            "--no-index --find-links /tmp/wheels --target /opt/mao/deps "
            "-r /tmp/requirements.txt && rm -rf /tmp/wheels /tmp/requirements.txt\n"
            "ENV PYTHONPATH=/opt/mao/deps\n")
        _build(client, ctx, tag, "deps", ",".join(pins), log)
    log(f"  built {tag} ({time.monotonic() - t0:.1f} s)")
    return tag


# ----- level 3: the project's sources ----------------------------------------------------

def _source_files() -> Iterator[Path]:
    for top in SOURCE_DIRS:
        for path in sorted((REPO_ROOT / top).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                yield path
    for name in SOURCE_FILES:
        yield REPO_ROOT / name


def _data_files() -> Iterator[tuple[Path, str]]:
    """(host file, path under DATA_DIR) of each bundled dataset file whose package is
    installed here (a missing one only makes that dataset unavailable in the image)."""
    import importlib.util

    from system.trainer.data import BUNDLED_FILES

    for package, relative in BUNDLED_FILES:
        spec = importlib.util.find_spec(package)
        if spec is not None and spec.submodule_search_locations:
            path = Path(spec.submodule_search_locations[0]) / relative
            if path.is_file():
                yield path, f"{package}/{relative}"


def node_tag(deps: str | None = None) -> str:
    deps = deps_tag() if deps is None else deps
    digest = hashlib.sha256()
    for path in _source_files():
        digest.update(str(path.relative_to(REPO_ROOT)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    for path, name in _data_files():
        digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return "mao-node:" + _hash({"sources": digest.hexdigest(), "deps": deps,
                                "layout": LAYOUT_VERSION})


@contextlib.contextmanager
def _build_lock() -> Iterator[None]:
    """One build at a time on this machine (tests in parallel, CI and a person)."""
    cache_dir().mkdir(parents=True, exist_ok=True)
    with open(cache_dir() / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def ensure_image(client=None, log: Log = _stderr) -> str:  # noqa: ANN001
    """The tag of the node image for the current sources, building what is missing."""
    client = client if client is not None else _client()
    deps = deps_tag()
    tag = node_tag(deps)
    if _image_exists(client, tag):
        return tag
    with _build_lock():
        if _image_exists(client, tag):
            return tag
        t_all = time.monotonic()
        first = not _image_exists(client, base_tag()) and not (
            cache_dir() / f"rootfs-{base_tag().split(':')[1]}.tar").exists()
        if first:
            log(f"building the node image (first time only; {FIRST_BUILD_MEASURED}): debootstrap "
                f"{SUITE} from {apt_mirror()}, project dependencies, sources")
        else:
            log(f"building the node image {tag} (none yet for these sources and dependencies; "
                f"cached levels are reused)")
        deps = ensure_deps(client, log)
        t0 = time.monotonic()
        log(f"  building {tag}: the sources of {', '.join(SOURCE_DIRS)} on top of {deps} ...")
        with tempfile.TemporaryDirectory(prefix="mao-node-ctx-") as tmp:
            ctx = Path(tmp)
            for path in _source_files():
                dest = ctx / "src" / path.relative_to(REPO_ROOT)
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, dest)
            (ctx / "data").mkdir()
            for path, name in _data_files():
                dest = ctx / "data" / name
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, dest)
            (ctx / "Dockerfile").write_text(
                f"FROM {deps}\n"
                "COPY src /opt/mao/src\n"
                f"COPY data {DATA_DIR}\n"
                f"ENV PYTHONPATH=/opt/mao/src:/opt/mao/deps:{DATA_DIR}\n"
                "WORKDIR /opt/mao/src\n"
                f"RUN python3 -m compileall -q /opt/mao/src && python3 -c '{NODE_IMPORT_CHECK}'\n")
            _build(client, ctx, tag, "node", tag, log)
        log(f"  built {tag} ({time.monotonic() - t0:.1f} s); the whole build took "
            f"{time.monotonic() - t_all:.1f} s ({load_conditions()})")
        return tag


def _client():  # noqa: ANN202
    from nemesis.platforms.docker import engine

    return engine()


def remove_images(client=None) -> list[str]:  # noqa: ANN001
    """Remove every image labelled by the project (node first, base last); return the tags
    removed. The rootfs tarball and wheels in the cache directory are kept."""
    import docker.errors

    client = client if client is not None else _client()
    order = {"node": 0, "deps": 1, "base": 2}
    images = client.images.list(filters={"label": f"{LABEL_PROJECT}={PROJECT}"})
    images.sort(key=lambda im: order.get(im.labels.get(LABEL_KIND, ""), 0))
    removed = []
    for image in images:
        names = image.tags or [image.short_id]
        with contextlib.suppress(docker.errors.NotFound):
            client.images.remove(image.id, force=True)
            removed.extend(f"image {name}" for name in names)
    return removed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m nemesis.platforms.image",
        description="Build (if needed) the Docker image the nodes run in and print its tag.")
    parser.add_argument("--remove", action="store_true",
                        help="remove every image of the project instead (the cache stays)")
    args = parser.parse_args(argv)
    try:
        if args.remove:
            for line in remove_images():
                print(f"removed {line}")
            return 0
        print(ensure_image())
        return 0
    except PlatformError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
