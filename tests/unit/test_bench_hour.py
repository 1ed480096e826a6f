"""bench.hour: its rows over a short hour stream on the random-weight videokv-tiny, its recall and its vision cache."""

from __future__ import annotations

import json

import torch

from bench.hour import main
import pytest

from bench.hour_rows import CachedVision, group_recall, names_option, plan_rows, row_config, shipped_variants
from videokv_node.memory.config import ConfigError
from videokv_node.vision_backend import VisionBackend


class Counting(VisionBackend):
    name, batch = "counting", None

    def __init__(self) -> None:
        self.calls = 0

    def encode(self, pixels: torch.Tensor) -> torch.Tensor:
        self.calls += len(pixels)
        return pixels.mean(dim=(2, 3))[:, None, :].repeat(1, 2, 1) + torch.randn(len(pixels), 2, 3)  # (B, 2, 3)


def test_cached_vision_returns_the_first_encoding_of_the_same_pixels():
    inner = Counting()
    cache = CachedVision(inner, size=2)
    a, b, c = (torch.full((1, 3, 4, 4), float(v)) for v in (1, 2, 3))
    first = cache.encode(a)
    assert torch.equal(cache.encode(a), first) and inner.calls == 1  # a hit is the stored tensor itself
    both = cache.encode(torch.cat([a, b]))
    assert torch.equal(both[0], first[0]) and inner.calls == 2
    cache.encode(c)  # evicts a (the oldest of a, b)
    assert not torch.equal(cache.encode(a), first) and inner.calls == 4


def test_group_recall_by_hand():
    groups = ((10, 11), (40,))
    # union has 11 and 40; layer 0 has 10 only, layer 1 has 40 only, layer 2 both groups
    assert group_recall(groups, {11, 40, 3}, [{10}, {40}, {11, 40}]) == (True, (0.5 + 0.5 + 1.0) / 3)
    assert group_recall(groups, {11}, []) == (False, 0.0)


def test_full_is_skipped_past_the_models_positions():
    rows, skipped = plan_rows(1800, 6, 30, 8192, ("rekv", "full+tgvkv"), ("robot",), (0.02,), frozenset())
    assert [r.policy for r in skipped] == ["full", "full+tgvkv"]
    assert "10,836 positions" in skipped[0].note
    assert [r.label for r in rows] == ["ceiling (things + 4 other frames)", "node defaults as shipped", "recency @ 2%",
                                       "node default (rekv, robot) @ 2%", "rekv (robot) @ 2%"]
    assert rows[2].frames == 36
    # the shipped row reads what the node's own parameters give, whatever the stream: window frames + retrieved
    from videokv_node.eval.settings import engine_settings

    mem = engine_settings({}).memory
    assert rows[1].frames == mem.local_window_tokens // 6 + mem.retrieve_frames


def test_variants_of_the_shipped_defaults_are_rows_of_their_own_named_for_what_they_set():
    variants = shipped_variants("memory.local_window_tokens=216 memory.retrieve_frames=18; memory.local_window_tokens=120")
    assert variants == [{"memory.local_window_tokens": 216, "memory.retrieve_frames": 18}, {"memory.local_window_tokens": 120}]
    rows, _ = plan_rows(1800, 12, 30, 8192, (), ("robot",), (0.02,), frozenset({"ceiling", "full", "recency", "default"}),
                        tuple(variants))
    assert [r.label for r in rows] == ["node defaults as shipped",
                                       "node defaults as shipped, but local_window_tokens 216, retrieve_frames 18",
                                       "node defaults as shipped, but local_window_tokens 120"]
    from videokv_node.eval.settings import engine_settings

    shipped = engine_settings({}).memory
    first = row_config(rows[1], 1800, 12, 30)
    assert (first.local_window_tokens, first.retrieve_frames, rows[1].frames) == (216, 18, 18 + 18)
    assert first.budget_tokens == shipped.budget_tokens and first.policy == shipped.policy  # the rest as shipped
    assert row_config(rows[2], 1800, 12, 30).retrieve_frames == shipped.retrieve_frames
    with pytest.raises(ConfigError, match="no_such"):
        shipped_variants("memory.no_such=1")
    with pytest.raises(ValueError, match="NAME=VALUE"):
        shipped_variants("memory.local_window_tokens")


def test_an_open_answer_is_right_when_it_names_the_right_option_and_no_other():
    counts = ("once", "twice", "three times", "four times")
    assert names_option("Twice.", "twice", counts)
    assert names_option("I saw it three times", "three times", counts)
    assert not names_option("four times", "three times", counts)  # 'times' alone is not 'three times'
    assert not names_option("twice, or three times", "twice", counts)  # two options named: not an answer
    order = ("green triangle", "blue circle")
    assert names_option("the green triangle came first", "green triangle", order)
    assert not names_option("green", "green triangle", order) and not names_option("", "green triangle", order)
    colours = ("red", "green", "blue", "yellow")
    assert names_option("It was blue!", "blue", colours) and not names_option("blueish", "blue", colours)


def test_open_answers_are_asked_beside_the_choice_and_tabled(tmp_path):
    out, details = tmp_path / "hour.md", tmp_path / "details.jsonl"
    assert main(["--model", "videokv-tiny-random", "--frames", "100", "--streams", "1", "--policies", "",
                 "--without", "shipped,full,recency,default", "--open", "--out", str(out), "--details", str(details),
                 "--footage", "", "--span", "defaults"]) == 0
    text = out.read_text()
    # a span's table heading says which span (bench.headline finds the main table by its heading alone)
    assert "### 100 frames a stream (0.1 h at 0.5 fps): the node's shipped defaults and the candidates for them" in text
    assert "Open answers against choice" in text and "open (greedy, names the right option only)" in text
    asked = [json.loads(line) for line in details.read_text().splitlines() if "question" in line]
    assert asked and all(isinstance(d["open"], str) for d in asked)


def test_a_short_hour_on_every_kind_of_row(tmp_path):
    out, details = tmp_path / "hour.md", tmp_path / "details.jsonl"
    assert main(["--model", "videokv-tiny-random", "--frames", "100", "--streams", "1", "--budgets", "0.03,0.06",
                 "--policies", "rekv,hermes", "--out", str(out), "--details", str(details), "--footage", "",
                 "--shipped-with", "memory.local_window_tokens=36 memory.retrieve_frames=2"]) == 0
    text = out.read_text()
    for label in ("ceiling", "node defaults as shipped", "but local_window_tokens 36, retrieve_frames 2", "| full |", "recency @ 3%", "node default (rekv, robot) @ 6%", "rekv (robot) @ 3%",
                  "rekv (robot) @ 6%", "hermes (robot) @ 6%"):
        assert label in text, label
    lines = details.read_text().splitlines()
    per_row, located = {}, {}
    for line in lines:
        d = json.loads(line)
        (located if "locate" in d else per_row).setdefault(d["row"], []).append(d)
    counts = {len(v) for v in per_row.values()}
    assert len(counts) == 1 and counts.pop() >= 8  # every row answered every question
    assert set(located) == set(per_row) and len({len(v) for v in located.values()}) == 1  # and ran every ~/locate
    for d in located["full"]:  # full holds every frame: each query returns 3 moments, a hit where they show it
        assert len(d["returned"]) == 3 and d["hit"] == any(a <= f <= b for a, b in d["returned"] for f in d["shown"])
    assert all(d["found"] for d in per_row["full"])  # full attends every frame
    assert all(d["found"] for d in per_row["ceiling (things + 4 other frames)"])
    for d in per_row["full"]:  # what each answer read: every frame seen by the time it was asked, once
        read = sorted(f for a, b in d["context"] for f in range(a, b + 1))
        assert read and read == list(range(len(read)))
        assert d["sources"] and all(isinstance(s, str) for s in d["sources"])
    assert max(sum(b - a + 1 for a, b in d["context"]) for d in per_row["full"]) == 100  # asked at the end: all
    for d in per_row["ceiling (things + 4 other frames)"]:  # the needles' frames are in the context it records
        assert all(any(a <= f <= b for a, b in d["context"] for f in g) for g in d["needles"])


def test_rows_share_an_engine_only_at_one_budget():
    """A row's budget decides what its policy drops, so rows at two budgets never share an engine (recency at 1%
    and 5% once answered alike); ``rekv``'s question-time variants at one budget do."""
    from bench.hour_rows import Row, engine_key, row_config

    def keys(policy):
        return {engine_key(row_config(Row("", policy, "robot", b), 1800, 6, 20)) for b in (0.01, 0.02, 0.05)}

    for policy in ("recency", "default", "rekv", "hermes", "streamkv", "mukv"):
        assert len(keys(policy)) == 3, policy
    same = {engine_key(row_config(Row("", p, "robot", 0.02), 1800, 6, 20)) for p in ("rekv", "rekv+shared", "rekv+rerank")}
    assert len(same) == 1


def test_the_hour_through_the_node_runs_the_shipped_memory_or_the_engine_row_s():
    from bench.hour_ros import node_params
    from bench.hour_rows import default_config

    shipped = node_params(1800, None, 12, 30)
    assert not any(k.startswith("memory.") for k in shipped)  # every memory.* parameter at the node's own default
    row = node_params(1800, 0.02, 12, 30)
    cfg = default_config(36, 12, 30)
    assert row == shipped | {"memory.budget_tokens": cfg.budget_tokens, "memory.local_window_tokens": cfg.local_window_tokens,
                             "memory.retrieve_frames": cfg.retrieve_frames, "memory.page_tokens": 1}
