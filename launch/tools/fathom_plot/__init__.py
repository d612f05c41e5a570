"""fathom_plot: the figures of `launch/tools/plot.py`.

runs          reads run directories: metrics.jsonl and the residual mode of the saved config
probe         reads and checks the JSON that `fathom probe --json` writes
run_figures   loss, throughput, gradient norm and communication curves of one or more runs
probe_figures depth-weight heatmaps and the width-disagreement KL of one probe
output        PlotError and the all-or-nothing PNG writer

Every figure is a matplotlib Figure built on the Agg canvas (no display, no pyplot state),
so a caller can read its axes before anything is saved.
"""
