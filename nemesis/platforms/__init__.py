"""Where the nodes run: `docker` (containers on a network the run creates) or `local`
(processes on loopback behind fault-injecting proxies), or `sim`: the deterministic
simulator in simulated time, or `ssh`: nodes on real hosts over SSH (both asked for by name
only). `choose` picks one and says why."""

from __future__ import annotations

from nemesis.platforms.base import PlatformUnavailable

PLATFORMS = ("docker", "local")


def docker_status() -> tuple[bool, str]:
    try:
        from nemesis.platforms.docker import docker_available
    except ImportError as exc:  # the SDK is a dependency; this is a broken install
        return False, f"the docker SDK cannot be imported ({exc})"
    return docker_available()


def choose(requested: str | None) -> tuple[str, str]:
    """(platform, reason): the requested one, or docker when an engine answers, else local.
    Raises PlatformUnavailable when docker is requested and no engine answers."""
    if requested == "local":
        return "local", "asked for with --platform local"
    if requested == "ssh":
        return "ssh", "asked for with --platform ssh: one node per host of --hosts"
    if requested == "sim":
        return "sim", "asked for with --platform sim: the simulator, in simulated time"
    ok, reason = docker_status()
    if requested == "docker":
        if not ok:
            raise PlatformUnavailable(f"--platform docker cannot start: {reason}")
        return "docker", f"asked for with --platform docker; {reason}"
    if ok:
        return "docker", f"default, because {reason}"
    return "local", f"default, because {reason}"
