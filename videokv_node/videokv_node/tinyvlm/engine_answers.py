"""``videokv-tiny``'s answers asked to the memory engine after a stream was ingested: open, and by option.

The memories asked (``stream_policies``): everything resident, and ReKV with 2 frames resident
so that answers need frames retrieved from host memory. ``scored_answers`` asks one question
the three ways the node can (``SCORINGS``): open (greedy), and with options, scored by option
likelihood and by the options' letters.
"""

from __future__ import annotations

from collections import defaultdict

from videokv_node.memory import Frame, GenerationConfig, MemoryConfig, Question, VideoMemoryEngine
from videokv_node.memory.config import OPTION_SCORINGS
from videokv_node.tinyvlm.heldout import MAX_NEW_TOKENS, is_right
from videokv_node.tinyvlm.render import render
from videokv_node.tinyvlm.scenes import Example, normalise_answer

SCORINGS = ("open", *OPTION_SCORINGS)  # open answers, then the node's multiple-choice scorings


def stream_policies(adapter) -> dict[str, MemoryConfig]:
    """The memories stream questions are answered from: everything resident (``full``), and ReKV with
    only 2 frames resident on the device, so answers need frames retrieved from host memory; its frames
    encoded in a window of the frame before, or each alone (a one-token local window: the demo's memory)."""
    sink, per_frame = len(adapter.prefix_ids()), adapter.tokens_per_frame
    offload = 64 * per_frame * adapter.geometry.bytes_per_token
    return {
        "full": MemoryConfig(policy="full", budget_tokens=sink + 64 * per_frame, local_window_tokens=32 * per_frame),
        "rekv, 2 frames resident": MemoryConfig(
            policy="rekv", budget_tokens=sink + 2 * per_frame, local_window_tokens=per_frame, offload_bytes=offload,
        ),
        "rekv, 2 resident, frames encoded alone": MemoryConfig(
            policy="rekv", budget_tokens=sink + 2 * per_frame, local_window_tokens=1, offload_bytes=offload,
        ),
    }


def engine_accuracy(adapter, examples: list[Example], config) -> dict[str, float]:
    """{kind: accuracy} of answers asked to a memory engine after the example's frames were streamed into it."""
    hits = defaultdict(list)
    for ex in examples:
        engine = VideoMemoryEngine(adapter, config, GenerationConfig(max_new_tokens=MAX_NEW_TOKENS))
        for i, scene in enumerate(ex.scenes):
            engine.ingest([Frame("/camera", (i + 1) * 10**9, render(scene))])
        hits[ex.kind].append(is_right(ex, engine.ask(Question(ex.question, max_new_tokens=MAX_NEW_TOKENS)).text))
    return {k: sum(v) / len(v) for k, v in hits.items()}


def full_memory(adapter) -> MemoryConfig:
    return stream_policies(adapter)["full"]


def scored_answers(adapter, frames: list, question: str, answer: str, options: list[str], config: MemoryConfig) -> dict[str, bool]:
    """Whether each of SCORINGS gets ``answer``: one engine fed ``frames``, asked open (greedy), then the same
    question with ``options`` scored by option likelihood and by the options' letters, as the node does."""
    engine = VideoMemoryEngine(adapter, config, GenerationConfig(max_new_tokens=MAX_NEW_TOKENS))
    for i, rgb in enumerate(frames):
        engine.ingest([Frame("/camera", (i + 1) * 10**9, rgb)])
    out = {"open": normalise_answer(engine.ask(Question(question, max_new_tokens=MAX_NEW_TOKENS)).text) == normalise_answer(answer)}
    for scoring in OPTION_SCORINGS:
        got = engine.ask(Question(question, options=list(options)), option_scoring=scoring)
        out[scoring] = got.option_index == options.index(answer)
    return out
