"""Errors the user can act on, and PNG files that appear whole or not at all.

A plot run either writes every figure it was asked for or leaves the output directory as it
found it: each figure is first rendered into a hidden temporary file beside its final name,
and only when all of them rendered are they renamed into place (a rename within one
directory is atomic, so a reader never sees a half-written PNG).
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

DPI = 100  # figure sizes are stated in inches at this density: 10 in -> 1000 px


class PlotError(Exception):
    """A problem with the input or the output directory, told to the user in one line."""


def new_figure(width_in: float, height_in: float) -> Figure:
    """A figure of exactly width_in x height_in inches (at DPI) on the Agg canvas.

    Constrained layout keeps labels inside the figure without changing its size, so the
    PNG has the stated pixel size (bbox_inches='tight' would crop it to something else).
    """
    figure = Figure(figsize=(width_in, height_in), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def pixel_size(figure: Figure) -> tuple[int, int]:
    """(width, height) in pixels of the PNG that write_figures will make of `figure`."""
    width_in, height_in = figure.get_size_inches()
    return round(width_in * DPI), round(height_in * DPI)


def prepare_directory(directory: Path) -> None:
    """Creates the output directory (and parents); a file in the way is a PlotError."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise PlotError(f"cannot create output directory {directory}: "
                        f"{error.strerror or error}") from None
    if not os.access(directory, os.W_OK):
        raise PlotError(f"output directory {directory} is not writable")


def write_figures(figures: dict[str, Figure], directory: Path) -> list[Path]:
    """Writes figures[name] to directory/name for every name, all or none.

    Returns the written paths. On any failure the temporary files are removed and the
    previous files (if any) under the final names are untouched.
    """
    prepare_directory(directory)
    staged: list[tuple[Path, Path]] = []
    try:
        for name, figure in figures.items():
            handle, temporary = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp",
                                                 dir=directory)
            staged.append((Path(temporary), directory / name))
            with os.fdopen(handle, "wb") as file:
                figure.savefig(file, format="png", dpi=DPI)
    except BaseException as error:
        for temporary, _ in staged:
            temporary.unlink(missing_ok=True)
        if isinstance(error, OSError):
            raise PlotError(f"cannot write into {directory}: {error.strerror or error}") \
                from None
        raise
    mode = 0o666 & ~_current_umask()  # mkstemp makes 0600; a PNG is as readable as any file
    for temporary, final in staged:
        os.chmod(temporary, mode)
        os.replace(temporary, final)
    return [final for _, final in staged]


def _current_umask() -> int:
    """The process umask (reading it means setting it, so it is set straight back)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask
