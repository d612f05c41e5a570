"""Reading the JSON of `fathom probe --json` (launch/probe.c) and checking its shape.

    {"checkpoint": STEP_DIR, "step": N, "weights": "ema"|"raw", "tokens": N, "slices": S,
     "sites": [{"name": "model.layers.0.attn_route", "sources": N, "streams": m,
                "heads": H, "kl_query": x|null, "kl_random": x|null,
                "mean_weights": [[[w_0 .. w_{N-1}] per head] per stream]}, ...]}

kl_* are null where the width probe does not apply (MSAR sites). A file of any other shape
is refused with the first place it differs, before anything is drawn.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .output import PlotError
from .runs import checkpoint_residual, number_or_nan, residual_label


@dataclass
class Site:
    """One routing site: weights[stream][head][source], and its width-disagreement KL."""

    name: str
    weights: list[list[list[float]]]
    kl_query: float
    kl_random: float

    @property
    def sources(self) -> int:
        return len(self.weights[0][0])


@dataclass
class Probe:
    """A probe of one checkpoint: its sites (in network order) and where it came from."""

    path: Path
    step: int
    weights: str
    tokens: int
    slices: int
    streams: int
    heads: int
    sites: list[Site]
    residual: dict[str, Any] | None  # the checkpoint's residual config, when readable

    def title(self) -> str:
        """What the probe is of: mode, step, weights, tokens (figure titles)."""
        mode = residual_label(self.residual) if self.residual else self.path.name
        return f"{mode}, step {self.step} ({self.weights} weights), {self.tokens} tokens"

    def delta_form(self) -> bool:
        """True when source 0 of every site is the learned null source (DESIGN 2.1)."""
        return bool(self.residual) and self.residual.get("form") == "delta"


def _require(condition: bool, path: Path, where: str, expected: str) -> None:
    if not condition:
        raise PlotError(f"{path} is not a fathom probe JSON: {where} should be {expected}")


def _whole_number(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _optional_number(value: Any) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


def _read_site(entry: Any, index: int, streams: int, heads: int, path: Path) -> Site:
    where = f"sites[{index}]"
    _require(isinstance(entry, dict), path, where, "an object")
    _require(isinstance(entry.get("name"), str), path, f"{where}.name", "a string")
    sources = entry.get("sources")
    _require(_whole_number(sources) and sources >= 1, path, f"{where}.sources",
             "a whole number >= 1")
    _require(entry.get("streams") == streams and entry.get("heads") == heads, path,
             f"{where}.streams/heads", f"{streams}/{heads} like sites[0]")
    for key in ("kl_query", "kl_random"):
        _require(_optional_number(entry.get(key)), path, f"{where}.{key}", "a number or null")
    weights = entry.get("mean_weights")
    shape = f"a [{streams}][{heads}][{sources}] array of numbers (streams, heads, sources)"
    _require(isinstance(weights, list) and len(weights) == streams, path,
             f"{where}.mean_weights", shape)
    for stream in weights:
        _require(isinstance(stream, list) and len(stream) == heads, path,
                 f"{where}.mean_weights", shape)
        for head in stream:
            _require(isinstance(head, list) and len(head) == sources
                     and all(_optional_number(w) for w in head), path,
                     f"{where}.mean_weights", shape)
    return Site(name=entry["name"],
                weights=[[[number_or_nan(w) for w in head] for head in stream]
                         for stream in weights],
                kl_query=number_or_nan(entry.get("kl_query")),
                kl_random=number_or_nan(entry.get("kl_random")))


def _checkpoint_residual(step_dir: Any) -> dict[str, Any] | None:
    """The residual config of the probed checkpoint, when its directory is still there."""
    return checkpoint_residual(Path(step_dir)) if isinstance(step_dir, str) else None


def read_probe(path: Path) -> Probe:
    """Reads and checks a probe JSON; any deviation from the shape above is a PlotError."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PlotError(f"probe file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as error:
        raise PlotError(f"cannot read {path}: {error}") from None
    except json.JSONDecodeError as error:
        raise PlotError(f"{path} is not valid JSON (line {error.lineno}: {error.msg})") \
            from None
    _require(isinstance(document, dict), path, "the top level", "an object")
    sites = document.get("sites")
    _require(isinstance(sites, list) and len(sites) > 0, path, "\"sites\"",
             "a non-empty array")
    _require(isinstance(sites[0], dict), path, "sites[0]", "an object")
    streams, heads = sites[0].get("streams"), sites[0].get("heads")
    _require(_whole_number(streams) and streams >= 1, path, "sites[0].streams",
             "a whole number >= 1")
    _require(_whole_number(heads) and heads >= 1, path, "sites[0].heads",
             "a whole number >= 1")
    for key in ("step", "tokens", "slices"):
        _require(_whole_number(document.get(key)), path, f"\"{key}\"", "a whole number")
    return Probe(path=path, step=document["step"], weights=str(document.get("weights", "")),
                 tokens=document["tokens"], slices=document["slices"], streams=streams,
                 heads=heads,
                 sites=[_read_site(entry, i, streams, heads, path)
                        for i, entry in enumerate(sites)],
                 residual=_checkpoint_residual(document.get("checkpoint")))


def has_width_probe(probe: Probe) -> bool:
    """True when some site has a finite KL (MSAR sites have none)."""
    return any(math.isfinite(site.kl_query) for site in probe.sites)
