"""Live progress of a run: one rewritten line on a terminal, a plain line every 10 s elsewhere
(CI logs), so a person sees elapsed time, operation outcomes and the faults now active."""

from __future__ import annotations

from typing import TextIO

PLAIN_EVERY_S = 10.0


class Progress:
    def __init__(self, out: TextIO, total_s: float) -> None:
        self.out = out
        self.total_s = total_s
        self.tty = hasattr(out, "isatty") and out.isatty()
        self._last_plain = -PLAIN_EVERY_S
        self._width = 0
        self._last_faults: list[str] = []

    def _line(self, elapsed: float, totals: dict[str, int], faults: list[str],
              notes: dict[str, int] | None = None) -> str:
        active = "; ".join(faults) if faults else "none"
        # Events that are no operation (the trainer's depositions) by name, after the outcomes.
        events = "".join(f" {name} {n}" for name, n in (notes or {}).items())
        return (f"[{elapsed:5.0f}s/{self.total_s:.0f}s] ok {totals['ok']} fail {totals['fail']} "
                f"info {totals['info']}{events} | faults: {active}")

    def update(self, elapsed: float, totals: dict[str, int], faults: list[str],
               notes: dict[str, int] | None = None) -> None:
        line = self._line(elapsed, totals, faults, notes)
        if self.tty:
            pad = max(0, self._width - len(line))
            self.out.write("\r" + line + " " * pad)
            self.out.flush()
            self._width = len(line)
        elif elapsed - self._last_plain >= PLAIN_EVERY_S or faults != self._last_faults:
            # Plain lines: every 10 s, and whenever a fault starts or ends.
            self._last_plain = elapsed
            self._last_faults = list(faults)
            print(line, file=self.out, flush=True)

    def done(self, elapsed: float, totals: dict[str, int],
             notes: dict[str, int] | None = None) -> None:
        line = self._line(elapsed, totals, [], notes)
        if self.tty:
            self.out.write("\r" + line + " " * max(0, self._width - len(line)) + "\n")
        elif elapsed - self._last_plain > 0.5:
            print(line, file=self.out)
        self.out.flush()


