"""Screenshots of run reports for the docs: python scripts/report_screenshots.py RUN_DIR OUT.png
[--height PX] [--serve STORE OUT.png]. Uses the same headless Chromium as the browser tests
(nemesis/report/browser.py: Debian's chromium and chromedriver, nothing downloaded)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nemesis.report import browser, write_report  # noqa: E402
from nemesis.report.serve import serve_in_thread  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--height", type=int, default=1500, help="viewport height (px)")
    parser.add_argument("--serve", nargs=2, metavar=("STORE", "OUT"), default=None,
                        help="also the store browser's index page")
    args = parser.parse_args()
    why = browser.ensure_chromium()
    if why:
        print(why, file=sys.stderr)
        return 1
    report = write_report(args.run_dir)
    driver = browser.start_driver(1280, args.height)
    try:
        driver.get(report.resolve().as_uri())
        driver.save_screenshot(str(args.out))
        print(args.out)
        if args.serve:
            server, thread = serve_in_thread(Path(args.serve[0]))
            try:
                driver.set_window_size(1280, 500)
                driver.get(f"http://127.0.0.1:{server.server_address[1]}/")
                driver.save_screenshot(args.serve[1])
                print(args.serve[1])
            finally:
                server.shutdown()
                server.server_close()
                thread.join(timeout=5)
    finally:
        driver.quit()
    return 0


if __name__ == "__main__":
    sys.exit(main())
