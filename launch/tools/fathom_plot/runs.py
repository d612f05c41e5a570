"""Reading a run directory: its metrics.jsonl (DESIGN 6) and the residual mode it trained.

metrics.jsonl holds one JSON object per logged step (`step loss ... skipped comm`) and one
per evaluation (`step val_loss val_ppl`). The residual mode is not in the metrics: it comes
from the resolved config `fathom train` writes to RUN_DIR/config.yaml, or, for a run made
before that file existed, from the config saved in the newest checkpoint (index.h5 root
attribute `config`, YAML text). A run with neither is labelled by its directory name.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .output import PlotError

COMM_KEYS = ("pp_send_bytes", "pp_recv_bytes", "pp_summary_bytes",
             "pp_summary_bytes_uncached", "fsdp_allgather_bytes",
             "fsdp_reducescatter_bytes", "allreduce_bytes")


@dataclass
class Run:
    """One run directory: its logged steps, its evaluations and the name in legends."""

    directory: Path
    label: str
    steps: list[dict[str, Any]] = field(default_factory=list)
    evals: list[dict[str, Any]] = field(default_factory=list)

    def series(self, key: str) -> list[float]:
        """The value of `key` on every logged step; NaN where JSON had null or no value."""
        return [number_or_nan(line.get(key)) for line in self.steps]

    def has_comm(self) -> bool:
        """True when some step line carries a `comm` entry with a non-zero byte count."""
        return any(number_or_nan(stage.get(key)) > 0
                   for line in self.steps for stage in line.get("comm") or []
                   for key in COMM_KEYS)

    def stage_count(self) -> int:
        """The number of pipeline stages the comm arrays describe (0 without comm)."""
        return max((len(line.get("comm") or []) for line in self.steps), default=0)


def number_or_nan(value: Any) -> float:
    """JSON numbers as float; null (what fathom writes for a non-finite value) as NaN."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return math.nan
    return float(value)


def read_metrics(path: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(step lines, eval lines) of a metrics.jsonl; any malformed line is a PlotError.

    fathom writes whole lines only (each is flushed as it ends), so a line that does not
    parse means the file was cut or edited; plotting part of it would hide that.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PlotError(f"{path} does not exist: is {path.parent} a fathom run directory?") \
            from None
    except (OSError, UnicodeDecodeError) as error:
        raise PlotError(f"cannot read {path}: {error}") from None
    steps: list[dict[str, Any]] = []
    evals: list[dict[str, Any]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            raise PlotError(f"{path} line {number} is not a whole JSON object "
                            "(truncated or corrupt file)") from None
        if not isinstance(entry, dict) or not isinstance(entry.get("step"), int):
            raise PlotError(f"{path} line {number} has no integer \"step\"")
        if "val_loss" in entry:
            evals.append(entry)
        elif "loss" in entry:
            steps.append(entry)
        else:
            raise PlotError(f"{path} line {number} has neither \"loss\" nor \"val_loss\"")
    if not steps:
        raise PlotError(f"{path} holds no logged step (empty file, or the run has not "
                        "logged yet)")
    return steps, evals


def checkpoint_residual(step_dir: Path) -> dict[str, Any] | None:
    """The `residual` section of the config saved in one checkpoint step directory."""
    try:
        import h5py
        import yaml
        with h5py.File(step_dir / "index.h5", "r") as index:
            text = index.attrs["config"]
        config = yaml.safe_load(text.decode() if isinstance(text, bytes) else text)
    except Exception:  # an unreadable checkpoint only costs the run its mode label
        return None
    residual = config.get("residual") if isinstance(config, dict) else None
    return residual if isinstance(residual, dict) else None


def saved_residual(directory: Path) -> dict[str, Any] | None:
    """The `residual` section of RUN_DIR/config.yaml, else of the newest checkpoint's."""
    try:
        import yaml
        config = yaml.safe_load((directory / "config.yaml").read_text(encoding="utf-8"))
        residual = config.get("residual") if isinstance(config, dict) else None
        if isinstance(residual, dict):
            return residual
    except Exception:  # no config.yaml (an older run) or an unreadable one: try a checkpoint
        pass
    latest = directory / "checkpoints" / "latest"
    try:
        step_dir = latest.read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return checkpoint_residual(directory / "checkpoints" / step_dir) if step_dir else None


def residual_label(residual: dict[str, Any]) -> str:
    """The name of a residual mode, as docs/residual-comparison.md writes it.

    standard -> "baseline"; attnres with 1 head -> "AttnRes (full, H 1)"; more heads ->
    "MHAR (block, H 4)"; msar -> "MSAR (block, m 4, H 4)"; the delta form adds ", delta".
    """
    mode = residual.get("mode", "standard")
    if mode == "standard":
        return "baseline"
    heads = residual.get("heads", 1)
    details = [str(residual.get("granularity", "block"))]
    if mode == "msar":
        name = "MSAR"
        details.append(f"m {residual.get('streams', 1)}")
    else:
        name = "AttnRes" if heads == 1 else "MHAR"
    details.append(f"H {heads}")
    if residual.get("form") == "delta":
        details.append("delta")
    return f"{name} ({', '.join(details)})"


def read_run(directory: Path) -> Run:
    """Reads one run directory; a missing directory or bad metrics is a PlotError."""
    if not directory.is_dir():
        raise PlotError(f"run directory {directory} does not exist")
    steps, evals = read_metrics(directory / "metrics.jsonl")
    residual = saved_residual(directory)
    label = residual_label(residual) if residual else directory.name
    return Run(directory=directory, label=label, steps=steps, evals=evals)


def read_runs(directories: list[Path]) -> list[Run]:
    """Reads every run; two runs of the same mode get their directory names added."""
    runs = [read_run(directory) for directory in directories]
    labels = [run.label for run in runs]
    for run in runs:
        if labels.count(run.label) > 1:
            run.label = f"{run.label}: {run.directory.name}"
    labels = [run.label for run in runs]
    for run in runs:  # the same mode in two directories of the same name
        if labels.count(run.label) > 1:
            run.label = str(run.directory)
    return runs
