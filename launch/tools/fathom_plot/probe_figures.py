"""Figures of one `fathom probe` result: depth weights per head, width disagreement.

depth_weights.png: one heatmap panel per depth head (MSAR: per stream and head, one row of
panels per stream), routing sites down in network order, sources across, the mean weight
on the probe batch as colour (one scale for all panels). A site reads only the sources
that exist before it, so the upper right of each panel is empty (grey). Size at 100 dpi:
    columns = heads (at most 4 a row when there is one stream), rows = streams or
    ceil(heads / 4); panel = max(2.6, 0.9 + 0.42 * max sources) in wide,
    max(1.8, 0.9 + 0.32 * sites) in tall;
    width = 2.0 + columns * panel + 1.1 in, height = 0.9 + rows * panel + 0.2 in.
width_kl.png: per site, the KL between one slice's depth softmax and the whole query's
(mean over tokens and slices; the MHAR paper's width-disagreement probe), for the trained
query and for a random query of the same norm. 900 px wide, max(400, 130 + 34 * sites)
px tall. MSAR sites have no width probe, so an MSAR probe gets no width_kl.png.
"""
from __future__ import annotations

import math

import numpy as np
from matplotlib import colormaps
from matplotlib.figure import Figure

from .output import new_figure
from .probe import Probe

PANELS_PER_ROW = 4
CELL_VALUES_UP_TO = 120  # cells per panel up to which each cell shows its number


def short_site_name(name: str) -> str:
    """`model.layers.3.mlp_route` -> `layers.3.mlp_route` (the rest is the same on all)."""
    return name.removeprefix("model.")


def source_names(probe: Probe, count: int) -> list[str]:
    """Source labels: b0 is the embedding; the delta form puts the null source first."""
    if probe.delta_form():
        return ["null"] + [f"b{n}" for n in range(count - 1)]
    return [f"b{n}" for n in range(count)]


def panel_grid(probe: Probe) -> tuple[int, int]:
    """(rows, columns) of depth-weight panels: a row per stream, or heads wrapped at 4."""
    if probe.streams > 1:
        return probe.streams, probe.heads
    columns = min(probe.heads, PANELS_PER_ROW)
    return math.ceil(probe.heads / columns), columns


def depth_weights_size(probe: Probe) -> tuple[float, float]:
    """The figure size in inches (module docstring), rounded to whole pixels at 100 dpi."""
    rows, columns = panel_grid(probe)
    most_sources = max(site.sources for site in probe.sites)
    panel_width = max(2.6, 0.9 + 0.42 * most_sources)
    panel_height = max(1.8, 0.9 + 0.32 * len(probe.sites))
    return (round(2.0 + columns * panel_width + 1.1, 2),
            round(0.9 + rows * panel_height + 0.2, 2))


def weight_matrix(probe: Probe, stream: int, head: int) -> np.ndarray:
    """[sites, max sources] mean weights of one stream and head; NaN where no source is."""
    most_sources = max(site.sources for site in probe.sites)
    matrix = np.full((len(probe.sites), most_sources), np.nan)
    for row, site in enumerate(probe.sites):
        matrix[row, :site.sources] = site.weights[stream][head]
    return matrix


def depth_weights_figure(probe: Probe) -> Figure:
    """depth_weights.png (module docstring)."""
    figure = new_figure(*depth_weights_size(probe))
    rows, columns = panel_grid(probe)
    grid = figure.subplots(rows, columns, squeeze=False, sharex=True, sharey=True)
    most_sources = max(site.sources for site in probe.sites)
    matrices = {(stream, head): weight_matrix(probe, stream, head)
                for stream in range(probe.streams) for head in range(probe.heads)}
    finite = [value for matrix in matrices.values() for value in matrix.flat
              if math.isfinite(value)]
    top = max(finite, default=1.0)
    colours = colormaps["viridis"].with_extremes(bad="#e6e6e6")
    show_values = len(probe.sites) * most_sources <= CELL_VALUES_UP_TO
    image = None
    for panel, (stream, head) in enumerate(matrices):
        axes = grid.flat[panel]
        matrix = matrices[stream, head]
        image = axes.imshow(matrix, cmap=colours, vmin=0, vmax=top, aspect="auto",
                            interpolation="nearest")
        axes.set_title(f"stream {stream}, head {head}" if probe.streams > 1
                       else f"head {head}", fontsize=10)
        axes.set_xticks(range(most_sources), source_names(probe, most_sources), fontsize=8)
        axes.set_yticks(range(len(probe.sites)),
                        [short_site_name(site.name) for site in probe.sites], fontsize=8)
        axes.set_xlabel("source")
        if panel % columns == 0:
            axes.set_ylabel("routing site")
        if show_values:
            _write_cell_values(axes, matrix, top)
    for unused in list(grid.flat)[len(matrices):]:
        unused.set_visible(False)
    colour_bar = figure.colorbar(image, ax=grid, shrink=0.9, pad=0.02, aspect=30)
    colour_bar.set_label("mean depth weight")
    figure.suptitle(f"Depth weights per site (b0 = embedding)\n{probe.title()}", fontsize=10)
    return figure


def _write_cell_values(axes, matrix: np.ndarray, top: float) -> None:
    """Each cell's weight as text, dark on light cells and light on dark ones."""
    for (row, column), value in np.ndenumerate(matrix):
        if math.isfinite(value):
            axes.text(column, row, f"{value:.2f}", ha="center", va="center", fontsize=7,
                      color="black" if value > 0.6 * top else "white")


def width_kl_size(probe: Probe) -> tuple[float, float]:
    """The figure size in inches (module docstring)."""
    return 9.0, round(max(4.0, 1.3 + 0.34 * len(probe.sites)), 2)


def width_kl_figure(probe: Probe) -> Figure:
    """width_kl.png (module docstring): horizontal bars, sites down as in depth_weights."""
    figure = new_figure(*width_kl_size(probe))
    axes = figure.add_subplot()
    positions = np.arange(len(probe.sites))
    bar = 0.38
    axes.barh(positions - bar / 2, [site.kl_query for site in probe.sites], height=bar,
              color="C0", label="trained query")
    axes.barh(positions + bar / 2, [site.kl_random for site in probe.sites], height=bar,
              color="C7", label="random query of the same norm (baseline)")
    axes.set_yticks(positions, [short_site_name(site.name) for site in probe.sites],
                    fontsize=8)
    axes.invert_yaxis()  # the first site on top, as in depth_weights.png
    axes.set_xlabel(f"KL(one slice's depth softmax || whole query's), nats "
                    f"(mean over tokens and {probe.slices} slices)")
    axes.set_ylabel("routing site")
    axes.set_title(f"Width disagreement per site: {probe.title()}", fontsize=11)
    axes.grid(True, axis="x", alpha=0.3)
    axes.legend(loc="best", fontsize=9)
    return figure
