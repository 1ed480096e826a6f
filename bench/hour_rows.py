"""The rows of ``bench.hour`` and what each measures: one memory configuration fed an hour stream, its answers.

A row's engine is the node's own (``VideoMemoryEngine``, the adapter's own preprocessing and
decoder); only the vision encoder's output is cached by the frame's content (``CachedVision``),
so that the stream's frames, fed to every row in lockstep, are encoded once.

Budgets follow ``bench/accuracy.py``'s ``memory_config`` (the long-stream grid's rules): a budget
``b`` is the share of the stream's frames, k = round(b n), whose tokens a question attends to.
Besides its rows, one more: **the node's default** (``rekv`` under the robot preset exactly as
config/memory.yaml sets it, one set retrieved for all layers by the question probe, the recent
window attended, frames encoded against the recent window), its window and retrieval splitting
the k frames in half. The node as shipped (``shipped_config``: its own window and retrieval, 8 + 16 frames of
videokv-tiny since issue 43, whatever the stream's length) is a row of its own, and ``--shipped-with`` rows try
other values: the candidates its defaults were chosen among.
"""

from __future__ import annotations

import dataclasses
import hashlib
import statistics
from dataclasses import dataclass, field

import torch

from bench.accuracy import OFFLOAD_BYTES, memory_config
from bench.long_stream import recency_config, with_preset
from videokv_node.eval.hour_stream import default_real_things
from videokv_node.memory import MemoryConfig
from videokv_node.memory.config import ReKVConfig
from videokv_node.memory.records.still_config import RedundancyConfig
from videokv_node.vision_backend import VisionBackend

CONTRAST = 3  # memory.rekv.contrast of the +contrast rows: w = 3 ranked the things best (docs/notes/2026-11-27-issue32-robots-hour.md)
# Rows of this bench only, besides bench.accuracy's POLICIES: ReKV's shared selection with the temporal contrast
# (memory/scoring/contrast.py), with the likelihood re-ranking too, and the node's default with it.
HOUR_POLICIES = ("rekv+contrast", "rekv+contrast+rerank", "default+contrast")
# The node default's rows run as the node does, still frames merged where the robot preset merges them (issue 36);
# every other policy row one block per frame, as the papers ingest (bench.still compares on against off).
NODE_STILL = RedundancyConfig().enabled


class CachedVision(VisionBackend):
    """A vision backend that remembers the last ``size`` encodings by the pixels' content (blake2b of the
    preprocessed tensor's bytes), so rows fed the same frame in lockstep encode it once. Exact: a hit
    returns the tensor the wrapped backend produced for the same bytes."""

    def __init__(self, inner: VisionBackend, size: int = 4) -> None:
        self.inner, self.size = inner, size
        self.name, self.batch = f"cached({inner.name})", inner.batch
        self._cache: dict[bytes, torch.Tensor] = {}
        self.misses = 0

    def encode(self, pixels: torch.Tensor) -> torch.Tensor:
        keys = [hashlib.blake2b(p.detach().cpu().contiguous().numpy().tobytes(), digest_size=16).digest() for p in pixels]
        missing = [i for i, k in enumerate(keys) if k not in self._cache]
        if missing:
            out = self.inner.encode(pixels[missing])  # (m, T, hidden)
            self.misses += len(missing)
            for i, row in zip(missing, out):
                self._cache[keys[i]] = row
            while len(self._cache) > self.size:
                self._cache.pop(next(iter(self._cache)))
        return torch.stack([self._cache[k] for k in keys])


@dataclass(slots=True)
class Row:
    label: str
    policy: str  # a bench.accuracy POLICIES name, 'default', 'recency', 'full', 'ceiling' or 'shipped'
    preset: str
    budget: float  # share of the stream's frames; 1.0 for full and the ceiling
    frames: int = 0  # frames of tokens a question attends to
    correct: list[bool] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    found: list[bool] = field(default_factory=list)  # every evidence group attended in some layer
    layer_share: list[float] = field(default_factory=list)  # mean over layers of the groups' share attended
    ttft_s: list[float] = field(default_factory=list)
    locate_top1: list[bool] = field(default_factory=list)
    locate_top3: list[bool] = field(default_factory=list)
    locate_error_s: list[float] = field(default_factory=list)  # |latest top-3 moment - last seen|
    ingest_first_ms: list[float] = field(default_factory=list)  # per frame, the stream's first 10%
    ingest_last_ms: list[float] = field(default_factory=list)  # per frame, its last 10%
    bytes_resident: list[int] = field(default_factory=list)  # at the end of each stream
    bytes_offloaded: list[int] = field(default_factory=list)
    details: list[dict] = field(default_factory=list)  # per question: stream, question, chosen and right option
    note: str = ""
    still: bool = False  # memory.redundancy.enabled (issue 36): still frames merged into spans
    encoder_calls: list[int] = field(default_factory=list)  # per stream, frames the engine encoded (ingested - merged)
    ingest_still_ms: list[float] = field(default_factory=list)  # per frame of a still shot, the row's ingest
    ingest_moving_ms: list[float] = field(default_factory=list)  # per frame of a moving shot
    locate_real_top3: list[bool] = field(default_factory=list)  # ~/locate of the real things (--real-things), top 3
    params: dict = field(default_factory=dict)  # 'shipped' rows: node parameters set over the shipped defaults
    open: bool = False  # --open: each question also asked without options, greedy (issue 43: open against choice)
    open_correct: list[bool] = field(default_factory=list)

    MERGED = ("details", "correct", "kinds", "found", "layer_share", "ttft_s", "locate_top1", "locate_top3", "locate_error_s",
              "ingest_first_ms", "ingest_last_ms", "bytes_resident", "bytes_offloaded", "encoder_calls", "ingest_still_ms",
              "ingest_moving_ms", "locate_real_top3", "open_correct")

    @property
    def key(self) -> str:
        return f"{self.policy}/{self.preset}@{self.budget}" + ("+still" if self.still else "")

    def median(self, name: str) -> float | None:
        values = getattr(self, name)
        return statistics.median(values) if values else None


def words_of(text: str) -> list[str]:
    return "".join(c if c.isalnum() else " " for c in text.lower()).split()


def names_option(answer: str, right: str, options: tuple[str, ...] | list[str]) -> bool:
    """An open answer is right when it names the right option (its words, in order, somewhere in the answer) and
    no other option ('the green triangle.' for 'green triangle'; 'twice' but not 'twice, or three times')."""
    said = words_of(answer)

    def named(option: str) -> bool:
        w = words_of(option)
        return any(said[i : i + len(w)] == w for i in range(len(said) - len(w) + 1))

    return named(right) and not any(named(o) for o in options if o != right)


def real_things_arg(value: str | None) -> tuple[str, ...]:
    """``--real-things`` of ``bench.hour`` and ``bench.hour_ros``: comma-separated sources ('' for none); not given,
    ``eval/hour_stream.py`` ``default_real_things``."""
    return default_real_things() if value is None else tuple(r for r in value.split(",") if r)


def default_config(k: int, T: int, sink: int) -> MemoryConfig:
    """The node's default memory (module doc) at k frames: config/memory.yaml's rekv, window and retrieval k/2 each."""
    window = max(1, k // 2)
    return MemoryConfig(policy="rekv", budget_tokens=sink + k * T + 1, local_window_tokens=window * T,
                        retrieve_frames=max(1, k - window), page_tokens=1, offload_bytes=OFFLOAD_BYTES,
                        rekv=ReKVConfig())


def shipped_config(params: dict | None = None) -> MemoryConfig:
    """The node's memory exactly as shipped (issue 43): every ``memory.*`` parameter at its default, as
    ``ros2 launch videokv_node memory.launch.py`` runs it, whatever the stream's length; ``params`` (node parameter
    names, 'memory.local_window_tokens') set over the defaults, as a params file would: the candidates a default
    is chosen among."""
    from videokv_node.eval.settings import engine_settings

    return engine_settings(dict(params or {})).memory


def shipped_frames(T: int, params: dict | None = None) -> int:
    """Frames a question of the shipped node reads at most: its recent window and the retrieved frames."""
    cfg = shipped_config(params)
    return cfg.local_window_tokens // T + cfg.retrieve_frames


def shipped_variants(text: str) -> list[dict]:
    """``--shipped-with``: ';'-separated sets of space-separated NAME=VALUE node parameters
    ('memory.local_window_tokens=216 memory.retrieve_frames=18; memory.local_window_tokens=288'), each checked
    as the node checks its parameters (ConfigError names a bad one)."""
    from videokv_node.eval.settings import parse_param

    variants = [dict(parse_param(p) for p in part.split()) for part in text.split(";") if part.strip()]
    for params in variants:
        shipped_config(params)
    return variants


def shipped_label(params: dict) -> str:
    """'node defaults as shipped', or with what a variant sets: '..., but local_window_tokens 216, retrieve_frames 18'."""
    changed = ", ".join(f"{k.removeprefix('memory.')} {v}" for k, v in params.items())
    return "node defaults as shipped" + (f", but {changed}" if changed else "")


def row_config(row: Row, n: int, T: int, sink: int) -> MemoryConfig:
    """The engine configuration of ``row`` on an ``n``-frame stream (the ceiling's is made by the caller)."""
    if row.policy == "shipped":
        return shipped_config(row.params)
    k = max(1, round(row.budget * n))
    if row.policy == "recency":
        return recency_config(k, T, sink)
    if row.policy == "full":
        return memory_config("full", 1.0, n, n, T, sink)
    base = {"default+contrast": "default", "rekv+contrast": "rekv+shared", "rekv+contrast+rerank": "rekv+rerank"}.get(row.policy, row.policy)
    cfg = default_config(k, T, sink) if base == "default" else memory_config(base, row.budget, k, n, T, sink)
    if base != row.policy:
        cfg = dataclasses.replace(cfg, rekv=dataclasses.replace(cfg.rekv, contrast=CONTRAST))
    cfg = with_preset(cfg, row.preset) if row.preset != "robot" else cfg
    return dataclasses.replace(cfg, redundancy=RedundancyConfig(enabled=row.still))  # off unless the row says (issue 36)


def engine_key(cfg: MemoryConfig) -> str:
    """Rows whose configurations differ only in what a question reads (the retrieval count and, for ``rekv``,
    its question-time choices ``memory.rekv.*``) encode and keep the same blocks: one engine serves them
    (``switch_row``). The budget is not among them: it decides what a policy drops (recency's oldest frames,
    HERMES' tokens) or offloads, and a block dropped under a small budget cannot come back for a larger one (rows
    at two budgets once shared an engine here, and recency answered the same at 1% and 5%)."""
    fields = dataclasses.asdict(cfg)
    for name in ("retrieve_frames",) + (("rekv",) if cfg.policy == "rekv" else ()):
        del fields[name]
    return repr(fields)


def switch_row(engine, target: MemoryConfig) -> None:
    """A shared engine (``engine_key``) set to a row's configuration before its question: the budget and
    retrieval count through ``reconfigure`` (which refuses any other difference), then ReKV's question-time
    choices, which only ``ReKVPolicy`` reads and only at a question (the node needs a restart for them;
    here they change no block, so the rows' answers are those of engines of their own)."""
    engine.reconfigure(dataclasses.replace(target, rekv=engine.config.rekv))
    if target.rekv != engine.config.rekv:
        engine.config = dataclasses.replace(engine.config, rekv=target.rekv)
        engine.policy.config = engine.config


def plan_rows(n: int, T: int, sink: int, max_positions: int, policies: tuple[str, ...], presets: tuple[str, ...],
              budgets: tuple[float, ...], without: frozenset[str], shipped_with: tuple[dict, ...] = ()) -> tuple[list[Row], list[Row]]:
    """(rows run, rows that cannot run here with the reason in ``note``), in table order; ``shipped_with``: variants
    of the shipped defaults (``shipped_variants``), a row each after the shipped one."""
    rows, skipped = [], []
    if "ceiling" not in without:
        rows.append(Row("ceiling (things + 4 other frames)", "ceiling", "robot", 1.0))
    for params in ({},) * ("shipped" not in without) + tuple(shipped_with):  # the node as shipped: its own budget
        rows.append(Row(shipped_label(params), "shipped", "robot", 1.0, shipped_frames(T, params),
                        still=shipped_config(params).redundancy.enabled, params=params))
    if "full" not in without:
        needs = sink + (n + 1) * T
        for p in ("full",) + (("full+tgvkv",) if "full+tgvkv" in policies else ()):
            for b in (1.0,) if p == "full" else budgets:
                r = Row(f"{p}" + (f" @ {b:.0%}" if p != "full" else ""), p, "robot", b, n)
                if needs > max_positions:
                    r.note = f"not run: {needs:,} positions needed, the model has {max_positions:,}"
                    skipped.append(r)
                else:
                    rows.append(r)
    for b in budgets:
        k = max(1, round(b * n))
        if "recency" not in without:
            rows.append(Row(f"recency @ {b:.0%}", "recency", "robot", b, k))
        for preset in presets:
            if preset == "robot" and "default" not in without:
                rows.append(Row(f"node default (rekv, robot) @ {b:.0%}", "default", "robot", b, k, still=NODE_STILL))
            for p in policies:
                if p != "full+tgvkv":  # the node default with contrast: as the node runs, still frames included
                    rows.append(Row(f"{p} ({preset}) @ {b:.0%}", p, preset, b, k, still=NODE_STILL and p == "default+contrast"))
    return rows, skipped


def group_recall(groups: tuple[tuple[int, ...], ...], attended: set[int], layers: list[set[int]]) -> tuple[bool, float]:
    """(every group has a frame attended in some layer, mean over layers of the share of groups with a frame
    attended there); frames are stream indices."""
    found = all(any(f in attended for f in g) for g in groups)
    if not layers:
        return found, float(found)
    shares = [sum(any(f in layer for f in g) for g in groups) / len(groups) for layer in layers]
    return found, sum(shares) / len(shares)


def engine_bytes(engine) -> tuple[int, int]:
    stats = engine.stats()
    return stats.bytes_resident, stats.bytes_offloaded

