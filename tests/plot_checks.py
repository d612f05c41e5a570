"""Checks of launch/tools/plot.py on real fathom output, run by tests/test_plot.c.

Usage: python3 tests/plot_checks.py CHECK ARGUMENT...   (exit 0: holds, 1: message why not)

Each check is one claim of the plot tool's contract: a PNG's pixel size, that its pixels
vary (not a blank canvas), and the labels its axes carry, read from the matplotlib Figure
objects before they are saved. The sizes are the ones the docstrings of
launch/tools/fathom_plot/run_figures.py and probe_figures.py state, worked out here for the
tiny model of tests/train_support.c (2 layers, block MHAR with 1 layer a block: 5 routing
sites over at most 3 sources).
"""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.image  # noqa: E402
import numpy  # noqa: E402

SOURCE = Path(__file__).resolve().parent.parent
PLOT = SOURCE / "launch" / "tools" / "plot.py"


def load_plot_tool():
    """plot.py as a module, with its fathom_plot package loaded (as plot.py loads it)."""
    spec = importlib.util.spec_from_file_location("plot_tool", PLOT)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    tool.load_fathom_plot()
    return tool


load_plot_tool()
from fathom_plot import probe_figures, run_figures  # noqa: E402
from fathom_plot.output import pixel_size  # noqa: E402
from fathom_plot.probe import read_probe  # noqa: E402
from fathom_plot.runs import COMM_KEYS, read_runs  # noqa: E402

RUN_PNG_SIZES = {"loss.png": (1000, 600), "throughput.png": (1000, 700),
                 "grad_norm.png": (1000, 600)}


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise AssertionError(message)


def run_plot(*arguments: str) -> subprocess.CompletedProcess:
    """Runs plot.py as a user does; a non-zero exit fails the check with its stderr."""
    done = subprocess.run([sys.executable, str(PLOT), *arguments], capture_output=True,
                          text=True)
    expect(done.returncode == 0, f"plot.py {' '.join(arguments)} exited "
           f"{done.returncode}:\n{done.stderr}")
    return done


def expect_png(path: Path, size: tuple[int, int]) -> None:
    """path is a PNG of `size` (width, height) pixels whose pixels are not all alike."""
    expect(path.is_file(), f"{path} was not written")
    expect(path.stat().st_mode & 0o444 == 0o444, f"{path.name} is not readable by all")
    pixels = matplotlib.image.imread(path)
    height, width = pixels.shape[:2]
    expect((width, height) == size, f"{path.name} is {width}x{height}, stated {size[0]}x"
           f"{size[1]}")
    colours = numpy.unique(pixels[..., :3].reshape(-1, 3), axis=0)
    expect(pixels[..., :3].std() > 0.02 and len(colours) > 16,
           f"{path.name} looks blank: {len(colours)} colours, std {pixels.std():.4f}")


def expect_only(directory: Path, names: set[str]) -> None:
    """directory holds exactly `names` (no leftover temporary file, nothing extra)."""
    present = {path.name for path in directory.iterdir()}
    expect(present == names, f"{directory} holds {sorted(present)}, expected {sorted(names)}")


def legend_texts(axes) -> list[str]:
    legend = axes.get_legend()
    return [text.get_text() for text in legend.get_texts()] if legend else []


def tick_texts(labels) -> list[str]:
    return [label.get_text() for label in labels]


# ---- the checks ----

def check_run_pngs(run_dir: str, out: str) -> None:
    """One run gives loss, throughput and grad_norm PNGs of their stated sizes, and no
    comm.png: a one-process run's comm bytes are all zero."""
    run_plot(run_dir, "--out", out)
    for name, size in RUN_PNG_SIZES.items():
        expect_png(Path(out) / name, size)
    expect_only(Path(out), set(RUN_PNG_SIZES))


def check_run_labels(run_dir: str) -> None:
    """The run figures carry their axis labels, and the legend names the residual mode
    read from the run's checkpoint config."""
    (run,) = read_runs([Path(run_dir)])
    expect(run.label == "MHAR (block, H 4)", f"label {run.label!r}")
    expect(len(run.evals) > 0, "the run logged no val_loss")

    loss = run_figures.loss_figure([run]).axes[0]
    expect(loss.get_xlabel() == "tokens seen", loss.get_xlabel())
    expect(loss.get_ylabel() == "loss (nats per token)", loss.get_ylabel())
    expect(legend_texts(loss) == ["MHAR (block, H 4)", "train loss (solid)",
                                  "val_loss (dashed, dots)"],
           str(legend_texts(loss)))
    log_loss = run_figures.loss_figure([run], log_x=True).axes[0]
    expect(log_loss.get_xscale() == "log" and "log scale" in log_loss.get_xlabel(),
           "--log-x does not make the tokens axis logarithmic")

    figure = run_figures.throughput_figure([run])
    labels = {(axes.get_xlabel(), axes.get_ylabel()) for axes in figure.axes}
    for pair in [("", "tokens/s per device"), ("", "peak memory (GiB)"), ("step", "MFU (%)")]:
        expect(pair in labels, f"throughput axes {labels} lack {pair}")

    figure = run_figures.grad_norm_figure([run])
    labels = {(axes.get_xlabel(), axes.get_ylabel()) for axes in figure.axes}
    for pair in [("step", "gradient norm (before clipping)"), ("", "learning rate")]:
        expect(pair in labels, f"grad_norm axes {labels} lack {pair}")
    for figure, name in [(run_figures.loss_figure([run]), "loss.png"),
                         (run_figures.throughput_figure([run]), "throughput.png"),
                         (run_figures.grad_norm_figure([run]), "grad_norm.png")]:
        expect(pixel_size(figure) == RUN_PNG_SIZES[name], f"{name}: {pixel_size(figure)}")


def check_skipped_steps(run_dir: str) -> None:
    """A logged window with a skipped step is marked on grad_norm.png and in its legend
    (the metrics are the run's, with skipped set to 1 on its second line)."""
    (run,) = read_runs([Path(run_dir)])
    run.steps[1]["skipped"] = 1
    axes = run_figures.grad_norm_figure([run]).axes[0]
    expect("skipped steps (non-finite)" in legend_texts(axes), str(legend_texts(axes)))
    marks = [line for line in axes.get_lines() if line.get_marker() == "x"]
    expect(len(marks) == 1 and list(marks[0].get_xdata()) == [run.steps[1]["step"]],
           "the skipped step is not marked at its step")


def check_comm(comm_dir: str, out: str) -> None:
    """comm.png, one row per stage, from a real two-stage run (pp2 v2 under mpirun): its
    metrics carry the bytes each stage sent, all of them non-zero for pp."""
    stages = 2
    steps = [json.loads(text) for text in
             (Path(comm_dir) / "metrics.jsonl").read_text().splitlines()]
    steps = [entry for entry in steps if "loss" in entry]
    expect(steps and all(len(entry["comm"]) == stages for entry in steps),
           "the run's metrics do not carry a comm object per stage")
    expect(all(entry["comm"][stage]["pp_send_bytes"] > 0 and
               entry["comm"][stage]["pp_summary_bytes"] <
               entry["comm"][stage]["pp_summary_bytes_uncached"]
               for entry in steps for stage in range(stages)),
           "a stage sent nothing, or its cached summaries are not fewer than uncached")

    (run,) = read_runs([Path(comm_dir)])
    figure = run_figures.comm_figure([run])
    titles = [axes.get_title() for axes in figure.axes]
    for stage in range(stages):
        expect(f"stage {stage}: bytes per step by kind" in titles, str(titles))
        expect(f"stage {stage}: pp block summaries, cached vs uncached" in titles,
               str(titles))
    byte_axes = [axes for axes in figure.axes if "bytes" in axes.get_title()
                 or "summaries" in axes.get_title()]
    expect(len(byte_axes) == 2 * stages and
           all(axes.get_ylabel() == "bytes per step" for axes in byte_axes),
           str([axes.get_ylabel() for axes in figure.axes]))
    # the run's hops were timed: a third panel a stage, each hop kind ran and, through
    # MPI, was all exposed
    for stage in range(stages):
        expect(f"stage {stage}: communication time per step" in titles, str(titles))
    expect(all(entry["comm"][stage]["pp_recv_ms"] > 0 and
               entry["comm"][stage]["pp_recv_exposed_ms"] == entry["comm"][stage]["pp_recv_ms"]
               for entry in steps for stage in range(stages)),
           "a stage's hop receives were not timed, or not all exposed on the cpu")
    times = legend_texts(figure.axes[2])
    expect(times[-2:] == ["ran", "exposed (compute waited)"] and "pp receive" in times,
           str(times))
    kinds = legend_texts(figure.axes[0])
    for kind in ["pp send", "pp receive"]:
        expect(kind in kinds, f"comm legend {kinds} lacks {kind}")
    # without FSDP those bytes are zero, and a zero series is left out of the legend
    expect(not any(kind.startswith("FSDP") for kind in kinds),
           f"comm legend {kinds} shows FSDP bytes of a run that has none")
    expect(legend_texts(figure.axes[1]) == ["measured (with the cross-stage cache)",
                                            "uncached (every summary)"],
           str(legend_texts(figure.axes[1])))
    run_plot(comm_dir, "--out", out)
    expect_png(Path(out) / "comm.png", (1800, 80 + 320 * stages))


def check_probe_pngs(probe_json: str, out: str) -> None:
    """A block-MHAR probe (H 4, 5 sites, at most 3 sources) gives depth_weights.png of
    1350 x 360 px and width_kl.png of 900 x 400 px."""
    run_plot("--probe", probe_json, "--out", out)
    expect_png(Path(out) / "depth_weights.png", (1350, 360))
    expect_png(Path(out) / "width_kl.png", (900, 400))
    expect_only(Path(out), {"depth_weights.png", "width_kl.png"})


def check_probe_labels(probe_json: str) -> None:
    """depth_weights has one panel per head, sites down by name, sources across; width_kl
    names the sites and sets the trained query beside the random baseline."""
    probe = read_probe(Path(probe_json))
    figure = probe_figures.depth_weights_figure(probe)
    panels = [axes for axes in figure.axes if axes.get_title().startswith("head")]
    expect([axes.get_title() for axes in panels] == ["head 0", "head 1", "head 2", "head 3"],
           str([axes.get_title() for axes in figure.axes]))
    sites = ["layers.0.attn_route", "layers.0.mlp_route", "layers.1.attn_route",
             "layers.1.mlp_route", "final_route"]
    expect(tick_texts(panels[0].get_yticklabels()) == sites,  # the others share its axis
           str(tick_texts(panels[0].get_yticklabels())))
    for axes in panels:
        expect(tick_texts(axes.get_xticklabels()) == ["b0", "b1", "b2"],
               str(tick_texts(axes.get_xticklabels())))
        expect(axes.get_xlabel() == "source", axes.get_xlabel())
    expect(panels[0].get_ylabel() == "routing site", panels[0].get_ylabel())
    expect(any(axes.get_ylabel() == "mean depth weight" for axes in figure.axes),
           "no colour bar labelled 'mean depth weight'")
    expect("MHAR (block, H 4)" in figure.get_suptitle(), figure.get_suptitle())
    image = panels[0].get_images()[0].get_array()
    expect(image.shape == (5, 3) and int(image.mask.sum()) == 2 + 1 + 1,
           "panel 0 is not sites x sources with the missing sources masked")

    axes = probe_figures.width_kl_figure(probe).axes[0]
    expect(tick_texts(axes.get_yticklabels()) == sites, str(tick_texts(axes.get_yticklabels())))
    expect(axes.get_xlabel().startswith("KL(") and axes.get_ylabel() == "routing site",
           f"{axes.get_xlabel()!r} / {axes.get_ylabel()!r}")
    expect(legend_texts(axes) == ["trained query", "random query of the same norm (baseline)"],
           str(legend_texts(axes)))


def check_msar_probe(probe_json: str, out: str) -> None:
    """An MSAR probe (2 streams, H 1) gives one panel per stream, 570 x 610 px, and no
    width_kl.png (MSAR sites have no width probe)."""
    probe = read_probe(Path(probe_json))
    figure = probe_figures.depth_weights_figure(probe)
    titles = [axes.get_title() for axes in figure.axes if axes.get_title()]
    expect(titles == ["stream 0, head 0", "stream 1, head 0"], str(titles))
    run_plot("--probe", probe_json, "--out", out)
    expect_png(Path(out) / "depth_weights.png", (570, 610))
    expect_only(Path(out), {"depth_weights.png"})


def check_overlay(out: str, *run_dirs: str) -> None:
    """Several runs share each figure, one legend entry per run, named by residual mode."""
    runs = read_runs([Path(directory) for directory in run_dirs])
    labels = [run.label for run in runs]
    expect(labels == ["baseline", "MHAR (block, H 4)"], str(labels))
    loss = legend_texts(run_figures.loss_figure(runs).axes[0])
    expect(loss == ["baseline", "MHAR (block, H 4)", "train loss (solid)",
                    "val_loss (dashed, dots)"], str(loss))
    colours = {line.get_color() for line in run_figures.loss_figure(runs).axes[0].get_lines()}
    expect(len(colours) == 2, f"the two runs are drawn in {colours}")
    throughput = legend_texts(run_figures.throughput_figure(runs).axes[0])
    expect(throughput[:2] == labels, str(throughput))
    run_plot(*run_dirs, "--out", out)
    for name, size in RUN_PNG_SIZES.items():
        expect_png(Path(out) / name, size)


CHECKS = {name.removeprefix("check_").replace("_", "-"): function
          for name, function in globals().items() if name.startswith("check_")}

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in CHECKS:
        sys.exit(f"usage: plot_checks.py {{{'|'.join(CHECKS)}}} ARGUMENT...")
    try:
        CHECKS[sys.argv[1]](*sys.argv[2:])
    except AssertionError as failure:
        sys.exit(f"{sys.argv[1]}: {failure}")
