"""Headless Chromium for the report's browser tests and the docs' screenshots.

Uses Debian's `chromium` and `chromium-driver` (`/usr/bin/chromium`, `/usr/bin/chromedriver`)
through PyPI's `selenium` (a dev extra), pointed at the system driver: it must never
download a browser or a driver (no registry but Debian's and PyPI's can be reached, and a
test that fetches a browser build is not reproducible). `ensure_chromium()` installs the two
Debian packages with apt-get when they are missing and we are root.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
PACKAGES = ("chromium", "chromium-driver")


def chromium_missing() -> str | None:
    """None when both are there, else what is missing."""
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not Path(p).exists()]
    return ", ".join(missing) if missing else None


def ensure_chromium(timeout_s: float = 900) -> str | None:
    """Install chromium and chromium-driver with apt-get if missing (root only). Returns
    None when they are there afterwards, else why not."""
    if chromium_missing() is None:
        return None
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return (f"{chromium_missing()} missing and cannot install it here (needs root and "
                f"apt-get): apt-get install {' '.join(PACKAGES)}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (["apt-get", "update", "-qq"],
                    ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *PACKAGES]):
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout_s)
        if done.returncode != 0:
            return f"{' '.join(command)} failed: {done.stderr.strip()[-500:]}"
    return None if chromium_missing() is None else f"still missing: {chromium_missing()}"


def start_driver(width: int = 1280, height: int = 900):  # noqa: ANN201 - a selenium WebDriver
    """A headless Chromium driven through the system chromedriver; quit() it when done."""
    os.environ.setdefault("SE_OFFLINE", "true")  # selenium-manager must not try to download
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                     "--disable-gpu", f"--window-size={width},{height}",
                     "--allow-file-access-from-files", "--hide-scrollbars"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)


def full_page_screenshot(driver, path: Path, width: int = 1280, max_height: int = 6000) -> Path:  # noqa: ANN001
    """The whole page (up to max_height pixels tall) as a PNG."""
    height = driver.execute_script(
        "return Math.max(document.body.scrollHeight, document.documentElement.scrollHeight)")
    driver.set_window_size(width, min(max_height, max(600, int(height) + 20)))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(path))
    return path
