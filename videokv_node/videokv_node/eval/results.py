"""Results of an evaluation run, written as they come so that a crash loses nothing.

``ResultWriter`` appends one row per answered question to ``results.csv`` and
flushes it at once; ``finish`` then writes ``summary.json`` (accuracy overall and
per question type, TTFT and ingest percentiles, peak memory, the full
configuration), three PNG plots and a ``report.md`` that embeds them. Questions
that could not be asked are appended to ``skipped.jsonl`` with the reason, also at
once. Every evaluation path (bag replay through the engine or the node, text
streams) writes through this one class, so their outputs compare column for column.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

# The columns of results.csv, in order (issue 6); question_type, stream_time_s and method follow them.
COLUMNS = (
    "video_id", "question", "answer", "prediction", "option_index", "correct", "ttft_s", "total_s",
    "encode_ms_total", "frames_in_memory", "tokens_resident", "bytes_resident", "bytes_offloaded", "evidence_stamps",
)
EXTRA_COLUMNS = ("question_type", "stream_time_s", "method", "needle_recall", "needle_recall_layers", "needle_token_share",
                 "span_recall", "in_span", "evidence_poses")


@dataclass(slots=True)
class QuestionResult:
    """One answered question and the memory's state when it was asked."""

    video_id: str
    question: str
    answer: str  # the expected answer as in the question file (letter or text)
    prediction: str  # the model's answer: the chosen option's text, or generated text
    option_index: int  # chosen option; -1 for an open question
    correct: bool | None  # None when it cannot be judged (an open question without a reference)
    ttft_s: float  # question received -> first token (or option scores)
    total_s: float  # question received -> answer complete
    encode_ms_total: float  # time spent encoding frames into memory up to this question
    frames_in_memory: int
    tokens_resident: int
    bytes_resident: int
    bytes_offloaded: int
    evidence_stamps: list[int] = field(default_factory=list)  # header stamps (ns) the answer attended to
    question_type: str = ""
    stream_time_s: float = 0.0  # when the question was asked, seconds from the stream's start
    method: str = ""  # how options were scored ("likelihood", "letter", "cloze"); "" for open questions
    needle_recall: float | None = None  # share of the ground-truth frames attended in any layer (eval/recall.py); None: no ground truth
    needle_recall_layers: float | None = None  # mean per-layer share; None: no ground truth or per-layer choice unseen
    needle_token_share: float | None = None  # mean per-layer share of the needles' tokens attended; None as the column above
    span_recall: float | None = None  # share of the ground-truth time spans holding an evidence frame (eval/grounding.py)
    in_span: float | None = None  # share of the evidence frames inside a ground-truth span; None: no spans
    evidence_poses: list[tuple[float, float, float] | None] | None = None  # per evidence stamp (x, y, yaw) or None; None: no poses
    truth_stamps: list[int] = field(default_factory=list)  # the truth's frames (ns) for the report's map; not a column
    truth_spans: list[tuple[int, int]] = field(default_factory=list)  # the truth's spans (ns) for the map; not a column

    def csv_row(self) -> list[str]:
        values = dataclasses.asdict(self)
        values["evidence_stamps"] = " ".join(f"{s / 1e9:.9f}" for s in self.evidence_stamps)
        values["correct"] = "" if self.correct is None else str(int(self.correct))
        for key in ("ttft_s", "total_s", "stream_time_s"):
            values[key] = f"{values[key]:.6f}"
        for key in ("needle_recall", "needle_recall_layers", "needle_token_share", "span_recall", "in_span"):
            values[key] = "" if values[key] is None else f"{values[key]:.4f}"
        values["encode_ms_total"] = f"{self.encode_ms_total:.3f}"
        # "x,y,yaw" per evidence stamp, "-" where that frame has no pose; empty when the target gives no poses
        values["evidence_poses"] = "" if self.evidence_poses is None else " ".join(
            "-" if p is None else ",".join(f"{v:.3f}" for v in p) for p in self.evidence_poses)
        return [str(values[c]) for c in COLUMNS + EXTRA_COLUMNS]


def _percentiles(samples: list[float]) -> dict[str, float | None]:
    if not samples:
        return {"p50": None, "p95": None, "n": 0}
    arr = np.asarray(samples, float)
    return {"p50": float(np.percentile(arr, 50)), "p95": float(np.percentile(arr, 95)), "n": len(samples)}


def _jsonable(value):
    """Configuration values (dataclasses, paths, tuples) as JSON."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {k: _jsonable(v) for k, v in dataclasses.asdict(value).items()}
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


class ResultWriter:
    """Writes one run's results into ``out_dir`` (created); ``finish`` once at the end.

    Invariant: every ``add``/``skip`` is on disk (flushed) when it returns, so
    results.csv and skipped.jsonl hold every question handled so far whatever
    happens next; ``finish`` only derives files from what was added.
    """

    def __init__(self, out_dir: Path, config: dict) -> None:
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.config = _jsonable(config)
        self.rows: list[QuestionResult] = []
        self.skipped: list[dict] = []
        self.memory: list[tuple[float, int, int]] = []  # (stream_time_s, bytes_resident, bytes_offloaded)
        self.ingest_ms: list[float] = []  # per frame
        self._csv_file = open(self.out_dir / "results.csv", "w", newline="", encoding="utf-8")
        self._csv = csv.writer(self._csv_file)
        self._csv.writerow(COLUMNS + EXTRA_COLUMNS)
        self._csv_file.flush()
        self._skip_file = open(self.out_dir / "skipped.jsonl", "w", encoding="utf-8")
        self.track = None  # eval/evidence_map.py's PoseTrack: the bag's odometry, set by the replay; maps where it has poses
        self.finished = False

    def add(self, row: QuestionResult) -> None:
        """Append an answered question to results.csv, flushed before returning."""
        self.rows.append(row)
        self._csv.writerow(row.csv_row())
        self._csv_file.flush()

    def skip(self, video_id: str, question: str, reason: str, stream_time_s: float | None = None) -> None:
        """Record a question that was not answered, and why (skipped.jsonl, flushed)."""
        entry = {"video_id": video_id, "question": question, "stream_time_s": stream_time_s, "reason": reason}
        self.skipped.append(entry)
        self._skip_file.write(json.dumps(entry) + "\n")
        self._skip_file.flush()

    def add_memory_sample(self, stream_time_s: float, bytes_resident: int, bytes_offloaded: int) -> None:
        self.memory.append((float(stream_time_s), int(bytes_resident), int(bytes_offloaded)))

    def add_ingest_ms(self, ms: float) -> None:
        """The encode time of one frame (vision tower + decoder prefill + policy)."""
        self.ingest_ms.append(float(ms))

    def close(self) -> None:
        """Close results.csv and skipped.jsonl without summarising (``finish`` calls it)."""
        self._csv_file.close()
        self._skip_file.close()

    # --- the summary ---------------------------------------------------------
    def summary(self) -> dict:
        judged = [r for r in self.rows if r.correct is not None]
        types: dict[str, list[bool]] = {}
        for r in judged:
            types.setdefault(r.question_type or "(none)", []).append(bool(r.correct))
        peak_res = max((m[1] for m in self.memory), default=max((r.bytes_resident for r in self.rows), default=0))
        peak_off = max((m[2] for m in self.memory), default=max((r.bytes_offloaded for r in self.rows), default=0))
        return {
            "questions_answered": len(self.rows),
            "questions_skipped": len(self.skipped),
            "questions_judged": len(judged),
            "accuracy": (sum(bool(r.correct) for r in judged) / len(judged)) if judged else None,
            "accuracy_per_question_type": {t: {"accuracy": sum(v) / len(v), "n": len(v)} for t, v in sorted(types.items())},
            "needle_recall": _recall_summary(self.rows),
            "grounding": _grounding_summary(self.rows),
            "ttft_s": _percentiles([r.ttft_s for r in self.rows]),
            "total_s": _percentiles([r.total_s for r in self.rows]),
            "ingest_ms_per_frame": _percentiles(self.ingest_ms),
            "peak_bytes_resident": int(peak_res),
            "peak_bytes_offloaded": int(peak_off),
            "skipped": self.skipped,
            "config": self.config,
        }

    def finish(self, extra: dict | None = None) -> dict:
        """Close the incremental files, write summary.json, the plots and report.md; returns the summary.

        ``extra`` keys are merged into the summary last (a path that measures something
        differently says so there, e.g. the node's own ingest percentiles).
        """
        if self.finished:
            raise RuntimeError("finish() was already called")
        self.finished = True
        self.close()
        summary = self.summary()
        summary.update(_jsonable(extra or {}))
        (self.out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        plots = self._plots(summary)
        (self.out_dir / "report.md").write_text(_report(summary, plots, self._maps()))
        return summary

    def _plots(self, summary: dict) -> list[tuple[str, str]]:
        import matplotlib

        matplotlib.use("Agg")  # files only: never a display
        import matplotlib.pyplot as plt

        made = []
        per_type = summary["accuracy_per_question_type"]
        if per_type:
            fig, ax = plt.subplots(figsize=(6, 3.5))
            names = list(per_type)
            ax.bar(names, [per_type[n]["accuracy"] for n in names], color="tab:blue")
            ax.set_ylim(0, 1)
            ax.set_ylabel("accuracy")
            ax.set_title("Accuracy per question type")
            for i, n in enumerate(names):
                ax.text(i, per_type[n]["accuracy"] + 0.02, f"n={per_type[n]['n']}", ha="center", fontsize=8)
            ax.tick_params(axis="x", labelrotation=30)
            made.append(self._save(fig, "accuracy_per_type.png", "Accuracy per question type"))
        if self.rows:
            fig, ax = plt.subplots(figsize=(6, 3.5))
            ax.hist([r.ttft_s * 1e3 for r in self.rows], bins=min(30, max(5, len(self.rows))), color="tab:orange")
            ax.set_xlabel("TTFT (ms)")
            ax.set_ylabel("questions")
            ax.set_title("Time to first token")
            made.append(self._save(fig, "ttft.png", "TTFT distribution"))
        if self.memory:
            t, res, off = zip(*sorted(self.memory))
            unit, scale = ("MiB", 2**20) if max(res + off) >= 2**20 else ("KiB", 2**10)
            fig, ax = plt.subplots(figsize=(6, 3.5))
            ax.plot(t, np.asarray(res) / scale, label="resident (device)")
            ax.plot(t, np.asarray(off) / scale, label="offloaded (host)")
            ax.set_xlabel("stream time (s)")
            ax.set_ylabel(f"KV memory ({unit})")
            ax.set_title("Memory over the stream")
            ax.legend()
            made.append(self._save(fig, "memory.png", "Memory over stream time"))
        return made

    def _maps(self) -> list[tuple[str, str]]:
        """Per answered question with a truth, a small map of its evidence against the truth (eval/evidence_map.py), where
        the bag had odometry: (file, caption)."""
        if self.track is None or len(self.track) < 2:
            return []
        from videokv_node.eval.evidence_map import draw_map, question_map

        made = []
        for i, r in enumerate(self.rows):
            if not (r.truth_stamps or r.truth_spans):
                continue
            qm = question_map(f"{i + 1}. {r.question}", r.evidence_stamps, r.truth_stamps, r.truth_spans, self.track)
            near = "n/a" if qm.nearest_m is None else f"{qm.nearest_m:.2f} m"
            made.append(self._save(draw_map(qm), f"map_{i + 1:03d}.png",
                                   f"{i + 1}. {r.question} (answered {r.prediction!r}; nearest evidence to the truth: {near})"))
        return made

    def _save(self, fig, name: str, title: str) -> tuple[str, str]:
        import matplotlib.pyplot as plt

        fig.tight_layout()
        fig.savefig(self.out_dir / name, dpi=100)
        plt.close(fig)
        return name, title


def _recall_summary(rows: list[QuestionResult]) -> dict:
    """Over the questions with ground-truth frames: how many had every needle frame attended (any
    layer), the mean recall, and the mean per-layer recall and token share where known."""
    with_gt = [r for r in rows if r.needle_recall is not None]
    layers = [r.needle_recall_layers for r in with_gt if r.needle_recall_layers is not None]
    tokens = [r.needle_token_share for r in with_gt if r.needle_token_share is not None]
    return {
        "n": len(with_gt),
        "all_needles_attended": sum(r.needle_recall == 1.0 for r in with_gt),
        "mean": sum(r.needle_recall for r in with_gt) / len(with_gt) if with_gt else None,
        "mean_layers": sum(layers) / len(layers) if layers else None,
        "mean_token_share": sum(tokens) / len(tokens) if tokens else None,
        "right_when_all_attended": sum(bool(r.correct) for r in with_gt if r.needle_recall == 1.0),
    }


def _grounding_summary(rows: list[QuestionResult]) -> dict:
    """Over the questions with ground-truth spans: the mean share of spans the evidence reached and
    the mean share of evidence frames inside a span (eval/grounding.py)."""
    with_gt = [r for r in rows if r.span_recall is not None]
    inside = [r.in_span for r in with_gt if r.in_span is not None]
    return {
        "n": len(with_gt),
        "span_recall": sum(r.span_recall for r in with_gt) / len(with_gt) if with_gt else None,
        "in_span": sum(inside) / len(inside) if inside else None,
    }


def _fmt(value, scale: float = 1.0, unit: str = "") -> str:
    return "n/a" if value is None else f"{value * scale:.1f}{unit}"


def _report(summary: dict, plots: list[tuple[str, str]], maps: list[tuple[str, str]] = ()) -> str:
    cfg = summary["config"]
    acc = summary["accuracy"]
    lines = [
        "# Evaluation report",
        "",
        f"- questions: {summary['questions_answered']} answered, {summary['questions_skipped']} skipped",
        f"- accuracy: {'n/a' if acc is None else f'{acc:.3f}'} over {summary['questions_judged']} judged questions",
        f"- TTFT p50 / p95: {_fmt(summary['ttft_s']['p50'], 1e3, ' ms')} / {_fmt(summary['ttft_s']['p95'], 1e3, ' ms')}",
        f"- ingest per frame p50 / p95: {_fmt(summary['ingest_ms_per_frame']['p50'], 1, ' ms')} / "
        f"{_fmt(summary['ingest_ms_per_frame']['p95'], 1, ' ms')}",
        f"- peak KV memory: {summary['peak_bytes_resident'] / 2**20:.2f} MiB resident, "
        f"{summary['peak_bytes_offloaded'] / 2**20:.2f} MiB offloaded",
    ]
    g = summary.get("grounding") or {}
    if g.get("n"):
        inside = "n/a" if g["in_span"] is None else f"{g['in_span']:.2f}"
        lines.append(f"- temporal grounding over {g['n']} questions with ground-truth spans: evidence reached "
                     f"{g['span_recall']:.2f} of the spans, {inside} of the evidence frames lie in one")
    lines.append("")
    if summary["accuracy_per_question_type"]:
        lines += ["| question type | accuracy | n |", "|---|---|---|"]
        lines += [f"| {t} | {v['accuracy']:.3f} | {v['n']} |" for t, v in summary["accuracy_per_question_type"].items()]
        lines.append("")
    lines += [f"![{title}]({name})\n" for name, title in plots]
    if maps:
        lines += ["## Where the evidence was seen", "", "Per question, on the bag's odometry: the path (grey), where the "
                  "truth was in view (green squares) and where the answer's evidence frames were taken (red crosses).", ""]
        lines += [f"{title}\n\n![{title}]({name})\n" for name, title in maps]
    if summary["skipped"]:
        lines += ["## Skipped questions", ""]
        lines += [f"- {s['video_id']}: {s['question']!r}: {s['reason']}" for s in summary["skipped"][:50]]
        lines.append("")
    lines += ["## Configuration", "", "```json", json.dumps(cfg, indent=2), "```", ""]
    return "\n".join(lines)
