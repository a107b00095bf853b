"""Installing the project on the hosts of `--platform ssh`, from wheels built here: the hosts
need no package registry, no pip and no compiler, only python3 (3.11 or newer) and sh.

- `build_project_wheel` makes a wheel of this checkout (`pip wheel --no-deps`, in a copy of
  the sources so the checkout gets no build/ or egg-info folders);
- `HOST_PROBE` asks a host's python3 its version and which of the node's runtime
  dependencies (`image.dependency_pins`: what the harness runs with here) it already has at
  those versions; only the missing ones are shipped, as the cp311 manylinux wheels the node
  image is built from (`image.download_wheels`, cached in ~/.cache/many-as-one). A host
  that lacks some and runs another Python than 3.11 is refused in one line: the wheels of
  compiled dependencies are for CPython 3.11;
- `install_script` unpacks the wheels copied into the run's folder into RUN/lib with the
  host's python3 and its zipfile module, as `pip install --target` would (the hosts need
  no pip: the node image has none, and on 2 busy cores pip's own start-up cost 2 s of CPU
  and 40 s of waiting per host, unpacking 0.04 s). Nothing is installed outside the run's
  folder, so removing that folder removes the installation.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from nemesis.platforms.base import PlatformError
from nemesis.platforms.image import (
    IMAGE_PYTHON,
    REPO_ROOT,
    cache_dir,
    dependency_pins,
    deps_tag,
    download_wheels,
)

PROJECT_PARTS = ("system", "nemesis", "checker", "workloads", "histories")
# Prints {"python": "3.11", "have": {name: version}} for the names in argv[1] (JSON list).
HOST_PROBE = (
    "import json, sys, importlib.metadata as m\n"
    "have = {}\n"
    "for name in json.loads(sys.argv[1]):\n"
    "    try: have[name] = m.version(name)\n"
    "    except m.PackageNotFoundError: pass\n"
    "print(json.dumps({'python': '%d.%d' % sys.version_info[:2], 'have': have}))\n")


def _project_files() -> list[Path]:
    files = [REPO_ROOT / "pyproject.toml", REPO_ROOT / "README.md"]
    for part in PROJECT_PARTS:
        files += sorted(p for p in (REPO_ROOT / part).rglob("*")
                        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc")
    return files


def project_wheel() -> Path:
    """The wheel of this checkout's project, built once per state of its sources and kept
    in the cache (a build takes 5-20 s)."""
    digest = hashlib.sha256()
    for path in _project_files():
        digest.update(str(path.relative_to(REPO_ROOT)).encode() + b"\0" + path.read_bytes())
    folder = cache_dir() / "project-wheels" / digest.hexdigest()[:12]
    found = sorted(folder.glob("many_as_one-*.whl"))
    if found:
        return found[-1]
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="partial-", dir=folder.parent) as tmp:
        wheel = build_project_wheel(Path(tmp))
        # Old builds are of sources that no longer exist here: keep only this one.
        for old in folder.parent.iterdir():
            if old.is_dir() and not old.name.startswith("partial-"):
                shutil.rmtree(old, ignore_errors=True)
        folder.mkdir()
        return Path(shutil.move(str(wheel), folder / wheel.name))


def build_project_wheel(out_dir: Path) -> Path:
    """A wheel of this checkout's project in `out_dir`."""
    with tempfile.TemporaryDirectory(prefix="mao-wheel-src-") as tmp:
        src = Path(tmp)
        for name in ("pyproject.toml", "README.md"):
            shutil.copy2(REPO_ROOT / name, src / name)
        for part in PROJECT_PARTS:
            shutil.copytree(REPO_ROOT / part, src / part,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "--disable-pip-version-check", "wheel", "--no-deps",
             "--no-build-isolation", "-q", "-w", str(out_dir), str(src)],
            capture_output=True, text=True)
    wheels = sorted(out_dir.glob("many_as_one-*.whl"))
    if proc.returncode != 0 or not wheels:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:]
        raise PlatformError(f"building the project's wheel failed (exit {proc.returncode}): "
                            f"{' '.join(tail)}")
    return wheels[-1]


def _name_of(pin: str) -> str:
    return pin.split("==")[0]


def missing_pins(pins: list[str], probe: dict) -> list[str]:
    """The pins a host does not have at exactly that version."""
    have = {k.lower().replace("_", "-"): v for k, v in probe.get("have", {}).items()}
    return [p for p in pins
            if have.get(_name_of(p).lower().replace("_", "-")) != p.split("==")[1]]


def check_python(label: str, probe: dict, missing: list[str]) -> None:
    version = probe.get("python", "?")
    major_minor = tuple(int(x) for x in version.split(".")) if version != "?" else (0, 0)
    if major_minor < (3, 11):
        raise PlatformError(f"{label}: python3 is {version}; the project needs 3.11 or newer")
    if missing and version != IMAGE_PYTHON[0]:
        raise PlatformError(f"{label}: python3 is {version} and lacks "
                            f"{', '.join(_name_of(p) for p in missing)}; the harness ships "
                            f"wheels for CPython {IMAGE_PYTHON[0]} only — install those "
                            f"packages on the host, or give it python3.11")


def dependency_wheels(pins: list[str], log) -> dict[str, Path]:  # noqa: ANN001
    """name -> wheel file of every pin, downloaded once into the cache (with pip's own,
    which `download_wheels` fetches for the image)."""
    directory = cache_dir() / f"wheels-{deps_tag(pins).split(':')[1]}"
    download_wheels(pins, directory, log)
    found: dict[str, Path] = {}
    for whl in directory.glob("*.whl"):
        found[whl.name.split("-")[0].lower().replace("_", "-")] = whl
    return found


def wheels_for(missing: list[str], wheels: dict[str, Path]) -> list[Path]:
    out = []
    for pin in missing:
        key = _name_of(pin).lower().replace("_", "-")
        if key not in wheels:
            raise PlatformError(f"no wheel of {pin} in the cache; delete "
                                f"{cache_dir()} and try again")
        out.append(wheels[key])
    return out


def probe_request() -> tuple[list[str], str]:
    """(the pins, the probe's argument)."""
    pins = dependency_pins()
    return pins, json.dumps([_name_of(p) for p in pins])


# Installs wheels into a folder as pip's --target does, with the standard library only:
# a wheel's files go to the folder as they are in the archive, those under
# NAME.data/purelib and NAME.data/platlib too; the other .data parts (scripts, headers,
# data files) are what a node never uses, and are skipped. argv: target, wheel...
UNPACK = (
    "import sys, zipfile\n"
    "target = sys.argv[1]\n"
    "for wheel in sys.argv[2:]:\n"
    "    with zipfile.ZipFile(wheel) as z:\n"
    "        for info in z.infolist():\n"
    "            top, _, rest = info.filename.partition('/')\n"
    "            if top.endswith('.data'):\n"
    "                kind, _, inner = rest.partition('/')\n"
    "                if kind not in ('purelib', 'platlib') or not inner:\n"
    "                    continue\n"
    "                info.filename = inner\n"
    "            z.extract(info, target)\n")


def install_script(remote_dir: str, wheels: list[str]) -> str:
    """The host's python3 unpacks the wheels into remote_dir/lib, offline."""
    files = " ".join(f"{remote_dir}/wheels/{name}" for name in wheels)
    return f"python3 -c {shlex.quote(UNPACK)} {remote_dir}/lib {files}"


def preflight(ssh, run_dir: str, *, iptables: bool) -> None:  # noqa: ANN001 - SshHosts
    """One line per missing piece on any host of `ssh`: iptables (if `iptables`), python3,
    a run folder already there."""
    from nemesis.platforms.base import last_line

    checks = (("command -v iptables >/dev/null 2>&1 || { echo no-iptables; exit 1; }; "
               if iptables else "")
              + "command -v python3 >/dev/null 2>&1 || { echo no-python3; exit 1; }; "
              f"[ ! -e {run_dir} ] || {{ echo run-dir-exists; exit 1; }}")
    answers = ssh.run_all({i: checks for i in range(len(ssh.hosts))}, timeout_s=60)
    for i, (code, out) in answers.items():
        if code == 0:
            continue
        label = ssh.hosts[i].label()
        if "no-iptables" in out:
            raise PlatformError(f"{label} has no iptables, which partitions need: install "
                                f"it (Debian: apt-get install iptables)")
        if "no-python3" in out:
            raise PlatformError(f"{label} has no python3 (3.11 or newer is needed)")
        if "run-dir-exists" in out:
            raise PlatformError(f"{label} already has {run_dir}: a run with this id is "
                                f"there; run `python -m nemesis clean --hosts FILE`")
        raise PlatformError(f"{label}: checking the host failed: {last_line(out)}")


def install_on_hosts(ssh, run_dir: str, chain: str, comment: str, log) -> None:  # noqa: ANN001
    """Make `run_dir` on every host of `ssh` (with its `owner`, `chain` and `comment`, which
    `ssh_clean` reads) and install the project into run_dir/lib: the project's wheel, and
    the wheels of the dependencies a host lacks."""
    from nemesis.platforms.base import last_line
    from nemesis.platforms.docker import owner_label

    pins, probe_arg = probe_request()
    count = len(ssh.hosts)
    probe = f"python3 -c {shlex.quote(HOST_PROBE)} {shlex.quote(probe_arg)}"
    owner = shlex.quote(owner_label())
    prepare = (f"mkdir -p {run_dir}/wheels {run_dir}/lib {run_dir}/tls && "
               f"chmod 700 {run_dir} && echo {owner} > {run_dir}/owner && "
               f"echo {chain} > {run_dir}/chain && "
               f"echo {shlex.quote(comment)} > {run_dir}/comment && {probe}")
    answers = ssh.run_all({i: prepare for i in range(count)}, timeout_s=60)
    missing: dict[int, list[str]] = {}
    for i, (code, out) in answers.items():
        label = ssh.hosts[i].label()
        try:
            found = json.loads(last_line(out, limit=10**6))
        except ValueError:
            raise PlatformError(f"{label}: preparing {run_dir} failed (exit {code}): "
                                f"{last_line(out)}") from None
        missing[i] = missing_pins(pins, found)
        check_python(label, found, missing[i])
    wheels = dependency_wheels(pins, log) if any(missing.values()) else {}
    t0 = time.monotonic()
    project = project_wheel()
    log(f"  the project's wheel: {time.monotonic() - t0:.1f} s")
    scripts = {}
    for i in range(count):
        deps = wheels_for(missing[i], wheels) if missing[i] else []
        if deps:
            log(f"  {ssh.hosts[i].label()} lacks {len(deps)} dependencies: shipping their "
                f"wheels")
        ssh.put(i, [project, *deps], f"{run_dir}/wheels")
        scripts[i] = install_script(run_dir, [w.name for w in [project, *deps]])
    t0 = time.monotonic()
    for i, (code, out) in ssh.run_all(scripts, timeout_s=600).items():
        if code != 0:
            raise PlatformError(f"{ssh.hosts[i].label()}: installing the project failed "
                                f"(exit {code}): {last_line(out)}")
    log(f"  unpacking on the hosts: {time.monotonic() - t0:.1f} s")
