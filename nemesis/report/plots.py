"""The report's plots, drawn with matplotlib (Agg, no display) as PNG bytes.

Two figures, both with every fault window shaded and labelled (which fault, which nodes)
and the first violation marked by a red line, as in Jepsen's latency-raw.png and rate.png:

- latency.png: one point per operation at its invoke time, latency on a log scale,
  coloured by outcome (ok / fail / info), shaped by function;
- rate.png: completions per second over time, one line per outcome.

Must never open a window or need a display; the same bytes go inline into report.html and
beside it as files for CI systems that show images.
"""

from __future__ import annotations

import io

from nemesis.report.data import RunData

OUTCOME_COLOURS = {"ok": "#1f77b4", "fail": "#d62728", "info": "#ff9f1c"}
FAULT_COLOURS = {"partition": "#f6c77a", "kill": "#f29a9a", "pause": "#9ec1ef",
                 "packet": "#c6a9ef", "member": "#a8d8b9", "crash": "#bbbbbb",
                 "truncate": "#e8b4d8", "bitflip": "#d9a3c7", "wipe-wal": "#c98fb5",
                 "lose-unsynced": "#f4a76b", "kill-all": "#e07a7a", "reorder": "#b3a2d9",
                 "slow-disk": "#d8c08a", "hold": "#a9c6c9"}
# One-off events drawn as vertical lines: a node that died on its own, a node that refused
# its data after a disk fault (its rejoin's steps are in the fault table's window).
EVENT_LINES = {"node-crashed": ("#666", ":"), "node-refused": ("#8b1a5a", "--")}
MARKERS = {"get": "o", "read": "o", "put": "^", "write": "^", "cas": "s", "delete": "x"}
WIDTH_IN, HEIGHT_IN, DPI = 11.0, 3.4, 100


def fault_colour(fault: str) -> str:
    return FAULT_COLOURS.get(fault, "#dddddd")


def render(data: RunData) -> dict[str, bytes]:
    """{"latency.png": ..., "rate.png": ...}; a run without operations still gets both
    (empty axes with the fault windows), so the page never has a broken image."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    try:
        return {"latency.png": _latency(plt, data), "rate.png": _rate(plt, data)}
    finally:
        plt.close("all")


def _axes(plt, data: RunData, ylabel: str):  # noqa: ANN001, ANN202
    figure, axes = plt.subplots(figsize=(WIDTH_IN, HEIGHT_IN), dpi=DPI)
    axes.set_xlabel("seconds since the first record" if data.timed else "history record")
    axes.set_ylabel(ylabel)
    axes.set_xlim(0, max(data.duration_s, 1e-3))
    axes.grid(True, which="major", color="#e6e6e6", linewidth=0.6)
    axes.set_axisbelow(True)
    return figure, axes


def _shade_faults(axes, data: RunData) -> None:  # noqa: ANN001
    """A band per fault window, labelled at its top left; crashes and refusals as lines
    (EVENT_LINES); the first violation as a red line."""
    for window in data.windows:
        axes.axvspan(window.start_s, window.end_s, color=fault_colour(window.fault), alpha=0.35,
                     linewidth=0)
        axes.text(window.start_s, 0.98, f" {window.label}", transform=axes.get_xaxis_transform(),
                  fontsize=7, va="top", ha="left", rotation=90, color="#444", clip_on=True)
    for marker in data.markers:
        if marker.f in EVENT_LINES:
            colour, style = EVENT_LINES[marker.f]
            axes.axvline(marker.time_s, color=colour, linestyle=style, linewidth=1)
    first = data.first_violation_s()
    if first is not None:
        axes.axvline(first, color="#b00020", linewidth=1.4)
        axes.text(first, 0.02, " first violation", transform=axes.get_xaxis_transform(),
                  fontsize=8, color="#b00020", va="bottom")


def _latency(plt, data: RunData) -> bytes:  # noqa: ANN001
    figure, axes = _axes(plt, data, "latency (ms, log scale)")
    axes.set_yscale("log")
    _shade_faults(axes, data)
    drawn = False
    for outcome, colour in OUTCOME_COLOURS.items():
        for f in sorted({p.f for p in data.points}):
            xs, ys = [], []
            for point in data.points:
                if point.outcome == outcome and point.f == f and point.latency_ms is not None:
                    xs.append(point.start_s)
                    ys.append(max(point.latency_ms, 0.01))
            if xs:
                axes.scatter(xs, ys, s=6, c=colour, marker=MARKERS.get(f, "o"), alpha=0.7,
                             linewidths=0, label=f"{f} {outcome}", rasterized=True)
                drawn = True
    if drawn:
        axes.legend(loc="upper right", fontsize=7, ncol=3, framealpha=0.85, markerscale=2)
    else:
        axes.text(0.5, 0.5, "no operation latencies recorded", transform=axes.transAxes,
                  ha="center", color="#666")
    figure.tight_layout()
    return _png(figure)


def _rate(plt, data: RunData) -> bytes:  # noqa: ANN001
    figure, axes = _axes(plt, data, "completions per second")
    _shade_faults(axes, data)
    # About 1 s bins for short runs, at most ~300 bins for long ones.
    bin_s = max(1.0, data.duration_s / 300.0) if data.timed else max(1.0, data.duration_s / 100)
    bins = max(1, int(data.duration_s / bin_s) + 1)
    drawn = False
    for outcome, colour in OUTCOME_COLOURS.items():
        counts = [0] * bins
        for point in data.points:
            if point.outcome == outcome and point.end_s is not None:
                counts[min(bins - 1, int(point.end_s / bin_s))] += 1
        if any(counts):
            xs = [(i + 0.5) * bin_s for i in range(bins)]
            axes.plot(xs, [c / bin_s for c in counts], color=colour, linewidth=1.2,
                      label=outcome, drawstyle="steps-mid")
            drawn = True
    if drawn:
        axes.legend(loc="upper right", fontsize=7, framealpha=0.85)
    axes.set_ylim(bottom=0)
    figure.tight_layout()
    return _png(figure)


def _png(figure) -> bytes:  # noqa: ANN001
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()
