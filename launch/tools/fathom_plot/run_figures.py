"""Curves of one or more runs: loss, throughput, gradient norm, communication.

Every figure overlays the runs it is given, one colour per run, with the run's label
(its residual mode) in the legend. Sizes at 100 dpi:

    loss.png        1000 x 600 px   train loss (solid) and val_loss (dashed, dots) vs tokens;
                                    the legend names each run once, then the two styles
    throughput.png  1000 x 700 px   tokens/s per device with peak memory on a second axis;
                                    MFU below; both vs step
    grad_norm.png   1000 x 600 px   gradient norm (log scale) with the learning rate on a
                                    second axis vs step; logged windows with skipped
                                    (non-finite) steps marked by red crosses
    comm.png        1200 x (80 + 320 * stages) px   one row per pipeline stage: pp, FSDP
                                    all-gather and reduce-scatter bytes per step; pp summary
                                    bytes measured beside the uncached count; 1800 px wide
                                    when the metrics carry communication times: a third
                                    panel of each kind's time per step, faint, and the part
                                    of it the compute waited for (exposed), solid
"""
from __future__ import annotations

import math

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import EngFormatter, FuncFormatter

from .output import new_figure
from .runs import Run, number_or_nan

BYTE_UNITS = ("B", "kB", "MB", "GB", "TB", "PB")


def run_colour(index: int) -> str:
    """The colour of the index-th run, the same in every figure."""
    return f"C{index % 10}"


def format_bytes(value: float, _position: object = None) -> str:
    """Axis tick text for a byte count in decimal units (12.4 MB), as the console prints."""
    unit = 0
    while abs(value) >= 1000 and unit + 1 < len(BYTE_UNITS):
        value /= 1000
        unit += 1
    return f"{value:.0f} {BYTE_UNITS[unit]}" if unit == 0 else f"{value:.1f} {BYTE_UNITS[unit]}"


def _steps(run: Run) -> list[float]:
    return run.series("step")


def _eval_tokens(run: Run) -> list[float]:
    """Tokens seen at each eval line: eval lines carry only the step, so take the tokens of
    the step line logged at that step, interpolating (tokens grow linearly in steps)."""
    steps, tokens = np.array(_steps(run)), np.array(run.series("tokens"))
    eval_steps = [float(line["step"]) for line in run.evals]
    if len(steps) == 1:
        per_step = tokens[0] / steps[0] if steps[0] else math.nan
        return [step * per_step for step in eval_steps]
    return list(np.interp(eval_steps, steps, tokens, left=None, right=None)) \
        if eval_steps else []


def _finish_legend(axes: Axes, handles: list, labels: list[str]) -> None:
    if handles:
        axes.legend(handles, labels, loc="best", fontsize=9, framealpha=0.9)


def loss_figure(runs: list[Run], log_x: bool = False) -> Figure:
    """loss.png: train loss and val_loss against tokens seen."""
    figure = new_figure(10, 6)
    axes = figure.add_subplot()
    handles, labels = [], []
    any_val = False
    for index, run in enumerate(runs):
        colour = run_colour(index)
        (line,) = axes.plot(run.series("tokens"), run.series("loss"), color=colour,
                            linewidth=1.6)
        handles.append(line)
        labels.append(run.label)
        if run.evals:
            any_val = True
            values = [number_or_nan(line.get("val_loss")) for line in run.evals]
            axes.plot(_eval_tokens(run), values, color=colour, linestyle="--", marker="o",
                      markersize=4, linewidth=1.2)
    # one entry per run (its colour), then what the line styles mean
    handles.append(Line2D([], [], color="grey", linewidth=1.6))
    labels.append("train loss (solid)")
    if any_val:
        handles.append(Line2D([], [], color="grey", linestyle="--", marker="o", markersize=4))
        labels.append("val_loss (dashed, dots)")
    if log_x:
        axes.set_xscale("log")
    axes.xaxis.set_major_formatter(EngFormatter(sep=""))
    axes.set_xlabel("tokens seen" + (" (log scale)" if log_x else ""))
    axes.set_ylabel("loss (nats per token)")
    axes.set_title("Loss")
    axes.grid(True, alpha=0.3)
    _finish_legend(axes, handles, labels)
    return figure


def throughput_figure(runs: list[Run]) -> Figure:
    """throughput.png: tokens/s per device and peak memory (top), MFU (bottom)."""
    figure = new_figure(10, 7)
    rate_axes, mfu_axes = figure.subplots(2, 1, sharex=True, height_ratios=[3, 2])
    memory_axes = rate_axes.twinx()
    handles, labels = [], []
    for index, run in enumerate(runs):
        colour, steps = run_colour(index), _steps(run)
        (rate,) = rate_axes.plot(steps, run.series("tokens_per_s_per_device"), color=colour,
                                 linewidth=1.6)
        memory_axes.plot(steps, run.series("mem_gib"), color=colour, linestyle=":",
                         linewidth=1.4)
        mfu_axes.plot(steps, [100 * value for value in run.series("mfu")], color=colour,
                      linewidth=1.6)
        handles.append(rate)
        labels.append(run.label)
    handles.append(Line2D([], [], color="grey", linestyle=":"))
    labels.append("peak memory (right axis)")
    rate_axes.set_ylabel("tokens/s per device")
    memory_axes.set_ylabel("peak memory (GiB)")
    memory_axes.set_ylim(bottom=0)
    rate_axes.set_ylim(bottom=0)
    rate_axes.set_title("Throughput and memory")
    rate_axes.grid(True, alpha=0.3)
    mfu_axes.set_ylabel("MFU (%)")
    mfu_axes.set_xlabel("step")
    mfu_axes.set_ylim(bottom=0)
    mfu_axes.grid(True, alpha=0.3)
    rate_axes.legend(handles, labels, loc="lower right", fontsize=9, framealpha=0.9)
    return figure


def grad_norm_figure(runs: list[Run]) -> Figure:
    """grad_norm.png: gradient norm, learning rate on a second axis, skipped steps marked."""
    figure = new_figure(10, 6)
    norm_axes = figure.add_subplot()
    lr_axes = norm_axes.twinx()
    handles, labels = [], []
    any_skipped = False
    for index, run in enumerate(runs):
        colour, steps = run_colour(index), _steps(run)
        norms = run.series("grad_norm")
        (norm,) = norm_axes.plot(steps, norms, color=colour, linewidth=1.4)
        lr_axes.plot(steps, run.series("lr"), color=colour, linestyle="--", linewidth=1.2)
        handles.append(norm)
        labels.append(run.label)
        skipped = [(step, norm_value) for step, norm_value, count
                   in zip(steps, norms, run.series("skipped")) if count > 0]
        for step, _ in skipped:
            norm_axes.axvline(step, color="red", alpha=0.25, linewidth=1)
        if skipped:
            any_skipped = True
            finite = [value for value in norms if math.isfinite(value)]
            height = max(finite) if finite else 1.0
            norm_axes.plot([step for step, _ in skipped], [height] * len(skipped),
                           linestyle="none", marker="x", color="red", markersize=8)
    handles.append(Line2D([], [], color="grey", linestyle="--"))
    labels.append("learning rate (right axis)")
    if any_skipped:
        handles.append(Line2D([], [], color="red", marker="x", linestyle="none"))
        labels.append("skipped steps (non-finite)")
    if all(value > 0 for run in runs for value in run.series("grad_norm")
           if math.isfinite(value)):
        norm_axes.set_yscale("log")
        plain = FuncFormatter(lambda value, _position: f"{value:g}")
        norm_axes.yaxis.set_major_formatter(plain)
        norm_axes.yaxis.set_minor_formatter(plain)
    norm_axes.set_xlabel("step")
    norm_axes.set_ylabel("gradient norm (before clipping)")
    lr_axes.set_ylabel("learning rate")
    lr_axes.set_ylim(bottom=0)
    norm_axes.set_title("Gradient norm and learning rate")
    norm_axes.grid(True, alpha=0.3)
    _finish_legend(norm_axes, handles, labels)
    return figure


# kinds of traffic on the left of a comm row: (metrics key, legend text, colour)
TRAFFIC = (("pp_send_bytes", "pp send", "C0"), ("pp_recv_bytes", "pp receive", "C1"),
           ("fsdp_allgather_bytes", "FSDP all-gather", "C2"),
           ("fsdp_reducescatter_bytes", "FSDP reduce-scatter", "C3"),
           ("allreduce_bytes", "all-reduce (shared tensors)", "C4"))
RUN_STYLES = ("-", "--", ":", "-.")
# the timed kinds (metrics' `*_ms` and `*_exposed_ms`), coloured as their bytes
TIMES = (("pp_send", "pp send", "C0"), ("pp_recv", "pp receive", "C1"),
         ("fsdp_allgather", "FSDP all-gather", "C2"),
         ("fsdp_reducescatter", "FSDP reduce-scatter", "C3"))


def _stage_series(run: Run, stage: int, key: str) -> tuple[list[float], list[float]]:
    """(steps, bytes) of one comm field of one stage, over the lines that carry it."""
    steps, values = [], []
    for line in run.steps:
        stages = line.get("comm") or []
        if stage < len(stages):
            steps.append(float(line["step"]))
            values.append(number_or_nan(stages[stage].get(key)))
    return steps, values


def comm_figure(runs: list[Run]) -> Figure:
    """comm.png: per stage, bytes per step by kind, and pp summaries cached vs uncached.

    Colour is the kind of traffic; the line style tells the runs apart when there are
    several (solid, dashed, dotted, dash-dot in argument order)."""
    stages = max(run.stage_count() for run in runs)
    timed = [key for key, _, _ in TIMES
             if any(value > 0 for run in runs for stage in range(stages)
                    for value in _stage_series(run, stage, key + "_ms")[1])]
    figure = new_figure(18 if timed else 12, 0.8 + 3.2 * stages)
    rows = figure.subplots(stages, 3 if timed else 2, squeeze=False, sharex=True)
    drawn = [key for key, _, _ in TRAFFIC
             if any(value > 0 for run in runs for stage in range(stages)
                    for value in _stage_series(run, stage, key)[1])]
    for stage, row in enumerate(rows):
        traffic_axes, summary_axes = row[0], row[1]
        if timed:
            _draw_times(row[2], runs, stage, timed, stage == stages - 1)
        for index, run in enumerate(runs):
            style = RUN_STYLES[index % len(RUN_STYLES)]
            for key, _, colour in TRAFFIC:
                if key in drawn or key == "pp_send_bytes":
                    traffic_axes.plot(*_stage_series(run, stage, key), color=colour,
                                      linestyle=style, linewidth=1.5)
            summary_axes.plot(*_stage_series(run, stage, "pp_summary_bytes"), color="C5",
                              linestyle=style, linewidth=1.5)
            summary_axes.plot(*_stage_series(run, stage, "pp_summary_bytes_uncached"),
                              color="C7", linestyle=style, linewidth=1.5)
        traffic_axes.set_title(f"stage {stage}: bytes per step by kind")
        summary_axes.set_title(f"stage {stage}: pp block summaries, cached vs uncached")
        for axes in (traffic_axes, summary_axes):
            axes.set_ylabel("bytes per step")
            axes.yaxis.set_major_formatter(FuncFormatter(format_bytes))
            axes.set_ylim(bottom=0)
            axes.grid(True, alpha=0.3)
        if stage == stages - 1:
            traffic_axes.set_xlabel("step")
            summary_axes.set_xlabel("step")
    kinds = [(text, colour) for key, text, colour in TRAFFIC
             if key in drawn or key == "pp_send_bytes"]
    run_handles = [Line2D([], [], color="black", linestyle=RUN_STYLES[i % len(RUN_STYLES)])
                   for i in range(len(runs))] if len(runs) > 1 else []
    rows[0][0].legend([Line2D([], [], color=colour) for _, colour in kinds] + run_handles,
                      [text for text, _ in kinds] + [run.label for run in runs][:len(run_handles)],
                      fontsize=8, loc="best")
    rows[0][1].legend([Line2D([], [], color="C5"), Line2D([], [], color="C7")] + run_handles,
                      ["measured (with the cross-stage cache)", "uncached (every summary)"]
                      + [run.label for run in runs][:len(run_handles)],
                      fontsize=8, loc="best")
    if timed:
        kinds = [(text, colour) for key, text, colour in TIMES if key in timed]
        rows[0][2].legend([Line2D([], [], color=colour) for _, colour in kinds]
                          + [Line2D([], [], color="black", alpha=0.35),
                             Line2D([], [], color="black", linewidth=2.0)],
                          [text for text, _ in kinds] + ["ran", "exposed (compute waited)"],
                          fontsize=8, loc="best")
    figure.suptitle("Communication per step" + (f": {runs[0].label}" if len(runs) == 1
                                                  else ""))
    return figure


def _draw_times(axes: Axes, runs: list[Run], stage: int, timed: list[str], last: bool) -> None:
    """One stage's communication times per step: each kind's time (faint) and its exposed
    part (solid), in milliseconds of one of the stage's ranks."""
    for index, run in enumerate(runs):
        style = RUN_STYLES[index % len(RUN_STYLES)]
        for key, _, colour in TIMES:
            if key not in timed:
                continue
            axes.plot(*_stage_series(run, stage, key + "_ms"), color=colour, alpha=0.35,
                      linestyle=style, linewidth=1.5)
            axes.plot(*_stage_series(run, stage, key + "_exposed_ms"), color=colour,
                      linestyle=style, linewidth=2.0)
    axes.set_title(f"stage {stage}: communication time per step")
    axes.set_ylabel("ms per step (a rank)")
    axes.set_ylim(bottom=0)
    axes.grid(True, alpha=0.3)
    if last:
        axes.set_xlabel("step")
