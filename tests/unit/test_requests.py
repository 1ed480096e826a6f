"""Questions: every refusal is a RequestError that changes nothing; valid filters restrict the evidence.

Refusals are checked against a snapshot of the whole memory (block ids and tiers,
the counters, the arena's free pages) and against the answer to a fixed valid
question before and after, so a refusal that touched memory would show.
Open-question decoding is checked token by token against a greedy decode of a
plain forward (float64, ``full`` policy holding the whole stream).
"""

from __future__ import annotations

import pytest

from tests.unit.helpers import greedy_tokens, plain_forward, random_frames
from videokv_node.memory import GenerationConfig, MemoryConfig, Question, RequestError, VideoMemoryEngine
from videokv_node.memory.question import Frame

CAMS = ("/cam_a", "/cam_b")
T = 16  # tiny model tokens per frame
QLIMIT = 160  # memory.max_question_tokens; the tiny tokenizer is byte-level, so 1 token per byte


def two_camera_frames(n: int, seed: int = 0) -> list[Frame]:
    """Frame i from CAMS[i % 2], stamped (i + 1) s."""
    frames = random_frames(n, seed=seed, h=8, w=8)
    return [Frame(CAMS[i % 2], f.stamp_ns, f.rgb) for i, f in enumerate(frames)]


def rekv_engine(adapter, limit: int = 8, n_frames: int = 12) -> VideoMemoryEngine:
    """Small caps so the memory has resident, offloaded and evicted frames; a QLIMIT-token question limit."""
    sink = len(adapter.prefix_ids())
    memory = MemoryConfig(
        policy="rekv",
        budget_tokens=sink + 4 * T,
        local_window_tokens=2 * T,
        offload_bytes=4 * T * adapter.geometry.bytes_per_token,
        retrieve_frames=2,
        max_question_tokens=QLIMIT,
    )
    engine = VideoMemoryEngine(adapter, memory, GenerationConfig(max_new_tokens=3, max_new_tokens_limit=limit))
    for f in two_camera_frames(n_frames):
        engine.ingest([f])
    return engine


def full_engine(adapter, frames: list[Frame], max_new_tokens: int = 3) -> VideoMemoryEngine:
    """Budget and window holding everything: answers equal a plain forward."""
    memory = MemoryConfig(policy="full", budget_tokens=100_000, local_window_tokens=50_000)
    engine = VideoMemoryEngine(adapter, memory, GenerationConfig(max_new_tokens=max_new_tokens, max_new_tokens_limit=16))
    engine.ingest(frames)
    return engine


FIXED = Question("what colour is the box?", options=["red", "green", "blue"], max_new_tokens=2)


def snapshot(engine):
    s = engine.stats()
    answer = engine.ask(FIXED)
    return (
        [(b.block_id, b.tier, b.stamp_ns, [list(kv.pages) for kv in b.layers]) for b in engine.store.blocks()],
        (s.frames_ingested, s.frames_in_memory, s.frames_evicted, s.tokens_resident, s.tokens_offloaded, s.bytes_offloaded),
        engine.store.arena.free_pages,
        (answer.text, answer.option_index, answer.option_scores, answer.evidence, answer.n_context_tokens),
    )


def test_fixture_memory_has_every_tier(tiny_adapter):
    s = rekv_engine(tiny_adapter).stats()
    assert (s.frames_in_memory, s.frames_evicted, s.tokens_offloaded) == (8, 4, 4 * T)


LONG = "what is on the table " * 8  # 168 bytes, 1 token each: over the limit

REFUSED = [
    (Question(""), "question is empty"),
    (Question(" \n\t "), "question is empty"),
    (Question("which?", options=["red", ""]), "options must not contain empty strings"),
    (Question("which?", options=["red", "  "]), "options must not contain empty strings"),
    (Question("which?", options=["red"]), "at least 2 options"),
    (Question("which?", options=[f"o{i}" for i in range(27)]), "at most 26 options"),
    (Question("when?", since_ns=5 * 10**9, until_ns=4 * 10**9), r"since \(5000000000 ns\) is after until \(4000000000 ns\)"),
    (Question("when?", since_ns=-1), "must not be negative"),
    (Question("when?", until_ns=-1), "must not be negative"),
    (Question(LONG), rf"question is \d+ tokens, longer than the limit of {QLIMIT} \(memory.max_question_tokens\)"),
    (Question("short?", options=["x" * (QLIMIT + 1), "y"]), rf"option 'x+' is {QLIMIT + 1} tokens, longer than the limit of {QLIMIT}"),
    (Question("what?", max_new_tokens=9), "max_new_tokens 9 exceeds the limit 8"),
    (Question("what?", cameras=["/cam_c"]), r"no frames in memory for cameras \['/cam_c'\]"),
    (Question("what?", since_ns=int(9.2e9), until_ns=int(9.8e9)), "no frames in memory for all cameras in the requested time"),
    (Question("what?", since_ns=13 * 10**9), "no frames in memory"),  # after the newest frame
    (Question("what?", until_ns=4 * 10**9), "no frames in memory"),  # frames 1..4 were evicted
    (Question("what?", cameras=["/cam_a"], since_ns=6 * 10**9, until_ns=6 * 10**9), "no frames in memory"),  # frame 6 is cam_b
]


@pytest.mark.parametrize("question, match", REFUSED, ids=[m[:30] for _, m in REFUSED])
def test_refused_question_changes_nothing(tiny_adapter, question, match):
    engine = rekv_engine(tiny_adapter)
    before = snapshot(engine)
    with pytest.raises(RequestError, match=match):
        engine.ask(question, on_token=lambda text: pytest.fail("a refused question must not generate"))
    assert snapshot(engine) == before


def test_listed_options_count_toward_the_question_limit_under_letter_scoring(tiny_adapter):
    # Letter scoring lists the options in the prompt, so they count; likelihood scoring asks the
    # question open and checks each option on its own (each fits here).
    engine = rekv_engine(tiny_adapter)
    before = snapshot(engine)
    question = Question("short?", options=["x" * 60, "y" * 60])
    with pytest.raises(RequestError, match=rf"question is \d+ tokens, longer than the limit of {QLIMIT}"):
        engine.ask(question, option_scoring="letter")
    assert snapshot(engine) == before
    assert len(engine.ask(question, option_scoring="likelihood").option_scores) == 2


def test_question_at_the_token_limit_is_accepted(tiny_adapter):
    engine = rekv_engine(tiny_adapter)
    overhead = len(tiny_adapter.question_ids("", []))
    assert len(tiny_adapter.question_ids("q" * (QLIMIT - overhead), [])) == QLIMIT
    engine.ask(Question("q" * (QLIMIT - overhead), max_new_tokens=1))
    with pytest.raises(RequestError, match=f"{QLIMIT + 1} tokens"):
        engine.ask(Question("q" * (QLIMIT + 1 - overhead), max_new_tokens=1))


def test_context_longer_than_the_model_is_refused_and_changes_nothing(tiny_adapter):
    engine = rekv_engine(tiny_adapter, limit=40_000)
    before = snapshot(engine)
    with pytest.raises(RequestError, match=r"context of \d+ positions exceeds the model's 32768"):
        engine.ask(Question("what?", max_new_tokens=33_000))
    assert snapshot(engine) == before


def test_negative_max_new_tokens_is_refused(tiny_adapter):
    engine = rekv_engine(tiny_adapter)
    with pytest.raises(RequestError, match="max_new_tokens"):
        engine.ask(Question("what?", max_new_tokens=-1))


# --- filters -----------------------------------------------------------------
def test_camera_filter_restricts_evidence(tiny_adapter):
    frames = two_camera_frames(8)
    engine = full_engine(tiny_adapter, frames)
    for cam in CAMS:
        answer = engine.ask(Question("what is there?", cameras=[cam], max_new_tokens=1))
        expected = [(f.stamp_ns, f.camera) for f in frames if f.camera == cam]
        assert [(e.stamp_ns, e.camera) for e in answer.evidence] == expected
    both = engine.ask(Question("what is there?", cameras=list(CAMS), max_new_tokens=1))
    assert [e.stamp_ns for e in both.evidence] == [f.stamp_ns for f in frames]


def test_camera_filter_with_retrieval(tiny_adapter):
    engine = rekv_engine(tiny_adapter, n_frames=30)
    answer = engine.ask(Question("what is there?", cameras=["/cam_b"], max_new_tokens=1))
    assert answer.evidence and {e.camera for e in answer.evidence} == {"/cam_b"}


@pytest.mark.parametrize("since_s, until_s, expected_s", [(3, 7, [3, 4, 5, 6, 7]), (3, 3, [3]), (6, 0, [6, 7, 8]), (0, 2, [1, 2])])
def test_time_window_is_inclusive(tiny_adapter, since_s, until_s, expected_s):
    engine = full_engine(tiny_adapter, two_camera_frames(8))
    answer = engine.ask(Question("what is there?", since_ns=since_s * 10**9, until_ns=until_s * 10**9, max_new_tokens=1))
    assert [e.stamp_ns for e in answer.evidence] == [s * 10**9 for s in expected_s]


def test_time_window_with_retrieval(tiny_adapter):
    engine = rekv_engine(tiny_adapter, n_frames=30)
    since, until = 20 * 10**9, 25 * 10**9
    answer = engine.ask(Question("what is there?", since_ns=since, until_ns=until, max_new_tokens=1))
    stamps = [e.stamp_ns for e in answer.evidence]
    assert stamps and all(since <= s <= until for s in stamps)
    assert stamps == sorted(set(stamps))


# --- answers -----------------------------------------------------------------
@pytest.mark.parametrize("n_options", [2, 3, 5])
def test_multiple_choice(tiny_adapter, n_options):
    engine = rekv_engine(tiny_adapter)
    options = ["a red box", "a blue ball", "a dog", "nothing", "a person"][:n_options]
    seen = []
    answer = engine.ask(Question("what is there?", options=options), on_token=seen.append)
    assert len(answer.option_scores) == n_options
    assert abs(sum(answer.option_scores) - 1.0) < 1e-5
    assert all(0.0 <= p <= 1.0 for p in answer.option_scores)
    assert answer.option_index == max(range(n_options), key=lambda i: answer.option_scores[i])
    assert answer.text == options[answer.option_index]
    assert seen == [answer.text]


def reference_tokens(adapter, frames, text: str, max_new: int) -> list[int]:
    """Greedy token ids after one plain forward over [prompt, frames, question]."""
    logits, cache = plain_forward(adapter, frames, adapter.question_ids(text, []))
    return greedy_tokens(adapter, logits, cache, cache.get_seq_length(), max_new)


@pytest.mark.parametrize("max_new", [1, 3, 6, 0])
def test_open_question_streams_tokens_up_to_max_new_tokens(tiny_adapter64, max_new):
    a = tiny_adapter64
    frames = two_camera_frames(4)
    engine = full_engine(a, frames, max_new_tokens=5)
    tokens = reference_tokens(a, frames, "describe the scene", max_new or 5)
    seen = []
    answer = engine.ask(Question("describe the scene", max_new_tokens=max_new), on_token=seen.append)
    assert seen == [a.decode(tokens[: i + 1]) for i in range(len(tokens))]  # one call per token, text so far
    assert len(seen) <= (max_new or 5)
    assert answer.text == a.decode(tokens).strip()
    assert (answer.option_index, answer.option_scores) == (-1, [])
