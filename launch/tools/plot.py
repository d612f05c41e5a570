#!/usr/bin/env python3
"""Draw fathom's metrics and probes as PNG figures.

Usage:
  python3 launch/tools/plot.py RUN_DIR [RUN_DIR ...] [--out DIR] [--log-x]
  python3 launch/tools/plot.py --probe PROBE.json [--out DIR]

Run directories (each with the metrics.jsonl that `fathom train` writes) give
  loss.png        train loss and val_loss against tokens (--log-x: log-scale tokens)
  throughput.png  tokens/s per device, peak memory and MFU against step
  grad_norm.png   gradient norm and learning rate against step, skipped steps marked
  comm.png        per pipeline stage, when the metrics carry non-zero `comm` bytes: bytes
                  by kind, summaries cached vs uncached, and (where logged) the time of
                  each kind and its part exposed to compute
Several run directories are overlaid, each labelled with its residual mode (read from the
config saved in its newest checkpoint; a run without a checkpoint is labelled by its
directory name). Output goes to --out, by default RUN_DIR/plots of the first run.

A probe JSON (`fathom probe --checkpoint RUN --json PROBE.json`) gives
  depth_weights.png  one heatmap per depth head (MSAR: per stream and head), sites down,
                     sources across, mean weight as colour
  width_kl.png       the width-disagreement KL per site beside a random-query baseline
                     (not for MSAR, whose sites have no width probe)
Output goes to --out, by default the plots/ folder beside PROBE.json.

All inputs are read and checked before anything is drawn, and the PNGs are written
through temporary files renamed into place: an error leaves no PNG, whole or partial.
Figure sizes are in the docstrings of fathom_plot/run_figures.py and probe_figures.py.

Exit codes: 0 done, 2 bad arguments or input (one line on stderr: "plot: error: ...").
"""
from __future__ import annotations

# launch/tools also holds tokenize.py, which would shadow the standard library's tokenize
# module (matplotlib imports it through inspect): take this folder off the import path and
# load the fathom_plot package from its file location instead.
import os
import sys

_TOOLS = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _TOOLS]

import argparse  # noqa: E402
import importlib.util  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import NoReturn  # noqa: E402


def load_fathom_plot() -> None:
    """Imports launch/tools/fathom_plot as the package `fathom_plot`."""
    if "fathom_plot" in sys.modules:
        return
    package = os.path.join(_TOOLS, "fathom_plot")
    spec = importlib.util.spec_from_file_location(
        "fathom_plot", os.path.join(package, "__init__.py"),
        submodule_search_locations=[package])
    module = importlib.util.module_from_spec(spec)
    sys.modules["fathom_plot"] = module
    spec.loader.exec_module(module)


def fail(message: str) -> NoReturn:
    """The one way this tool reports an error: one line on stderr, exit 2."""
    print(f"plot: error: {message}", file=sys.stderr)
    sys.exit(2)


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one `plot: error:` line like every other error."""

    def error(self, message: str) -> NoReturn:
        fail(f"{message} (see --help)")


def parse_arguments(argv: list[str]) -> argparse.Namespace:
    parser = OneLineParser(prog="plot.py", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="*", type=Path, metavar="RUN_DIR",
                        help="fathom run directories (with metrics.jsonl)")
    parser.add_argument("--probe", type=Path, metavar="PROBE.json",
                        help="a JSON written by `fathom probe --json`")
    parser.add_argument("--out", type=Path, metavar="DIR",
                        help="output directory (default: RUN_DIR/plots or beside PROBE.json)")
    parser.add_argument("--log-x", action="store_true",
                        help="log-scale tokens on loss.png")
    arguments = parser.parse_args(argv)
    if not arguments.runs and arguments.probe is None:
        parser.error("give one or more RUN_DIRs, or --probe PROBE.json")
    if arguments.runs and arguments.probe is not None:
        parser.error("give RUN_DIRs or --probe, not both (their figures go to different "
                     "folders)")
    return arguments


def run_figures(arguments: argparse.Namespace) -> tuple[dict, Path]:
    """Every figure of the runs, and the folder they go to (nothing written yet)."""
    from fathom_plot import run_figures as figures
    from fathom_plot.runs import read_runs

    runs = read_runs(arguments.runs)
    made = {
        "loss.png": figures.loss_figure(runs, log_x=arguments.log_x),
        "throughput.png": figures.throughput_figure(runs),
        "grad_norm.png": figures.grad_norm_figure(runs),
    }
    if any(run.has_comm() for run in runs):
        made["comm.png"] = figures.comm_figure(runs)
    else:
        print("plot: no comm.png: the metrics record no communication (one process)",
              file=sys.stderr)
    return made, arguments.out or arguments.runs[0] / "plots"


def probe_figures(arguments: argparse.Namespace) -> tuple[dict, Path]:
    """Every figure of the probe, and the folder they go to (nothing written yet)."""
    from fathom_plot import probe_figures as figures
    from fathom_plot.probe import has_width_probe, read_probe

    probe = read_probe(arguments.probe)
    made = {"depth_weights.png": figures.depth_weights_figure(probe)}
    if has_width_probe(probe):
        made["width_kl.png"] = figures.width_kl_figure(probe)
    else:
        print("plot: no width_kl.png: the probe has no width-disagreement KL (MSAR sites)",
              file=sys.stderr)
    return made, arguments.out or arguments.probe.parent / "plots"


def main(argv: list[str]) -> int:
    arguments = parse_arguments(argv)
    try:
        import matplotlib
        matplotlib.use("Agg")
        load_fathom_plot()
    except ImportError as missing:
        fail(f"the Python module {missing.name} is missing: pip install matplotlib numpy "
             "h5py pyyaml (launch/setup.sh installs them)")
    from fathom_plot.output import PlotError, write_figures

    try:
        figures, directory = (run_figures(arguments) if arguments.runs
                              else probe_figures(arguments))
        for path in write_figures(figures, directory):
            print(path)
    except PlotError as error:
        fail(str(error))
    except Exception as error:  # a figure that cannot be drawn from this input
        fail(f"cannot draw the figures: {type(error).__name__}: {error}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
