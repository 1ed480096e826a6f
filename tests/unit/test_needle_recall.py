"""Needle recall (``eval/recall.py``): hand-computed shares, the question file's ground truth, the
CSV/summary columns, and the engine's per-layer evidence and token shares on a policy that attends to
everything and on one that compresses token by token (HERMES)."""

from __future__ import annotations

import csv
import json

import pytest

from videokv_node.eval.questions import QuestionFileError, parse_questions
from videokv_node.eval.recall import frames_touched, needle_recall, needle_token_share
from videokv_node.eval.replay import MemoryState, Reply, _ask
from videokv_node.eval.results import ResultWriter
from videokv_node.memory import GenerationConfig, MemoryConfig, Question, VideoMemoryEngine
from videokv_node.memory.config import HermesConfig
from videokv_node.models.text_lm import TextLMAdapter, text_frame

MS = 1_000_000


def test_shares_by_hand():
    needles = [10 * MS, 20 * MS]
    # any layer: 10 ms attended (within 1 ms), 20 ms not -> 1/2
    # layers: [10], [10, 20], [] -> 1/2, 2/2, 0/2 -> mean 1/2
    assert needle_recall(needles, [10 * MS + 999_999, 30 * MS], [[10 * MS], [10 * MS, 20 * MS], []]) == (0.5, 0.5)
    assert needle_recall(needles, [10 * MS + 1_000_001]) == (0.0, None)  # outside the tolerance, layers unknown
    assert needle_recall([], [10 * MS], [[10 * MS]]) == (None, None)  # no ground truth: no recall


def test_token_shares_by_hand():
    needles = [10 * MS, 20 * MS]
    # layer 0: 10 ms kept whole (matched within 1 ms), 20 ms a quarter -> (1 + 0.25) / 2 = 0.625
    # layer 1: 10 ms half, 20 ms absent -> 0.25; layer 2: nothing -> 0. Mean: 0.875 / 3
    shares = [{10 * MS + 500_000: 1.0, 20 * MS: 0.25}, {10 * MS: 0.5, 30 * MS: 1.0}, {}]
    assert needle_token_share(needles, shares) == pytest.approx(0.875 / 3)
    assert needle_token_share(needles, [{10 * MS + 1_000_001: 1.0}]) == 0.0  # outside the tolerance
    assert needle_token_share([], shares) is None and needle_token_share(needles, None) is None


def test_frames_touched_by_hand():
    # Layer 0 touches 3 frames (one of them by 1 token of 24), layer 1 touches 1 (a zero share is
    # not a touch): (3 + 1) / 2.
    assert frames_touched([{10: 1.0, 20: 1 / 24, 30: 0.5}, {10: 0.0, 20: 1.0}]) == 2.0
    assert frames_touched([{}, {}]) == 0.0
    assert frames_touched([]) is None and frames_touched(None) is None


def test_question_files_carry_ground_truth_and_refuse_bad_stamps():
    (video,) = parse_questions([{"video_id": "v", "conversations": [
        {"question": "q?", "choices": ["a", "b"], "answer": "A", "end_time": 9.0, "evidence_stamps": [2.0, 4.5]},
        {"question": "open?", "answer": "x", "end_time": 9.0},
    ]}])
    assert [q.evidence_stamps for q in video.questions] == [(2.0, 4.5), ()]
    with pytest.raises(QuestionFileError, match=r"conversations\[0\].*evidence_stamps"):
        parse_questions([{"video_id": "v", "conversations": [
            {"question": "q?", "answer": "x", "end_time": 1.0, "evidence_stamps": [-1.0]}]}])


class FixedTarget:
    """Replies with given evidence; no model."""

    def __init__(self, evidence, layers, shares=None):
        self.reply = Reply("a", 0, evidence, 0.1, 0.2, "likelihood", layers, shares)

    def settle(self):
        pass

    def memory(self):
        return MemoryState(3, 10, 100, 0, 1.0)

    def ask(self, q):
        return self.reply


def test_rows_and_summary_carry_the_recall(tmp_path):
    (video,) = parse_questions([{"video_id": "v", "conversations": [
        {"question": "q1?", "choices": ["a", "b"], "answer": "A", "end_time": 9.0, "evidence_stamps": [2.0, 4.0]},
        {"question": "q2?", "choices": ["a", "b"], "answer": "B", "end_time": 9.0},
    ]}])
    writer = ResultWriter(tmp_path, {})
    origin = 100 * 1_000_000_000  # stream time 0 is stamp 100 s
    target = FixedTarget([origin + 2_000_000_000, origin + 4_000_000_000], [[origin + 2_000_000_000], []],
                         [{origin + 2_000_000_000: 0.5}, {}])
    for q in video.questions:
        _ask(target, "v", q, writer, origin)
    summary = writer.finish()
    with open(tmp_path / "results.csv") as f:
        rows = list(csv.DictReader(f))
    # token share: layer 0 keeps half of the 2 s needle, nothing of 4 s -> 0.25; layer 1 nothing -> mean 0.125
    assert [(r["needle_recall"], r["needle_recall_layers"], r["needle_token_share"]) for r in rows] == [
        ("1.0000", "0.2500", "0.1250"), ("", "", "")]
    assert summary["needle_recall"] == {"n": 1, "all_needles_attended": 1, "mean": 1.0, "mean_layers": 0.25,
                                        "mean_token_share": 0.125, "right_when_all_attended": 1}
    json.loads((tmp_path / "summary.json").read_text())  # serialisable


def test_full_attention_recalls_every_needle_in_every_layer():
    adapter = TextLMAdapter.tiny(seed=0)
    engine = VideoMemoryEngine(adapter, MemoryConfig(policy="full", budget_tokens=4096, local_window_tokens=64, page_tokens=1),
                               GenerationConfig(max_new_tokens=2))
    for i, text in enumerate(["a red cup", "a door", "the key"]):
        engine.ingest([text_frame(i + 1.0, text)])
    engine.ask(Question("where?", options=["x", "y"]))
    stamps = [round((i + 1) * 1e9) for i in range(3)]
    assert engine.last_layer_stamps == [stamps] * adapter.geometry.n_layers
    assert needle_recall(stamps[:1], stamps, engine.last_layer_stamps) == (1.0, 1.0)
    assert engine.last_layer_token_share == [dict.fromkeys(stamps, 1.0)] * adapter.geometry.n_layers


def test_token_shares_count_what_each_layer_keeps_of_a_frame():
    """HERMES compresses each layer token by token: a frame may stay in a layer by part of its tokens.
    The shares times the frame size must add up, per layer, to the frame tokens that layer holds (read
    on the store, not through the module), and some frame must be held in part (else the test proves nothing)."""
    adapter = TextLMAdapter.tiny(seed=0)
    T = adapter.tokens_per_frame
    sink = len(adapter.prefix_ids())
    config = MemoryConfig(policy="hermes", budget_tokens=sink + 3 * T + 2, local_window_tokens=1, page_tokens=1,
                          hermes=HermesConfig(chunk_frames=1))
    engine = VideoMemoryEngine(adapter, config, GenerationConfig(max_new_tokens=1))
    for i in range(8):
        engine.ingest([text_frame(i + 1.0, f"frame {i} shows a {['red', 'blue'][i % 2]} cup near door {i}")])
    engine.ask(Question("which cup?", options=["red", "blue"]))
    shares = engine.last_layer_token_share
    assert len(shares) == adapter.geometry.n_layers
    partial = False
    for layer, held in enumerate(shares):
        frames = [b for b in engine.store.blocks() if b.kind != "summary" and b.layers[layer] is not None]
        assert sum(v * T for v in held.values()) == pytest.approx(sum(b.layers[layer].keys.shape[-2] for b in frames))
        assert sorted(held) == engine.last_layer_stamps[layer]
        partial |= any(0.0 < v < 1.0 for v in held.values())
    assert partial
