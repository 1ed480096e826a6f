"""memory.preset (issue 15): the paper preset's values and precedence, and the mechanisms it switches
on, each checked against a reference written here (hand-computed values, the model's own modules,
transformers' eager attention), never against the module's helpers."""

from __future__ import annotations

import re
from dataclasses import fields, is_dataclass
from pathlib import Path

import pytest
import torch

from tests.unit import references as ref
from tests.unit.helpers import random_frames, scene
from videokv_node.eval.settings import engine_settings
from videokv_node.memory import ConfigError, GenerationConfig, MemoryConfig, Question, VideoMemoryEngine
from videokv_node.memory.config import POLICIES, HermesConfig, StreamKVConfig
from videokv_node.memory.records.presets import PAPER, preset_memory_config, preset_values
from videokv_node.memory.context.question_span import question_span
from videokv_node.memory.context.retrieval_cache import QueryCapture
from videokv_node.memory.scoring.segmenter import SegmenterConfig, SemanticSegmenter

# --- the preset's values and precedence ----------------------------------------

def test_robot_is_the_dataclass_defaults_for_every_policy():
    for policy in POLICIES:
        assert preset_values("robot", policy) == {}
        assert preset_memory_config("robot", policy) == MemoryConfig(policy=policy)

def test_paper_values_are_the_seeds():
    rekv = preset_memory_config("paper", "rekv")
    assert (rekv.local_window_tokens, rekv.retrieve_frames, rekv.rekv.query, rekv.rekv.question_window) == (15000, 64, "question", False)
    sk = preset_memory_config("paper", "streamkv")
    assert (sk.local_window_tokens, sk.streamkv.retrieve_frames, sk.streamkv.similarity, sk.streamkv.similarity_threshold) == (15000, 8, "mean", 0.99)
    assert (sk.streamkv.min_segment_frames, sk.streamkv.max_segment_frames, sk.streamkv.compression_ratio) == (4, 64, 0.6)
    h = preset_memory_config("paper", "hermes").hermes
    assert preset_memory_config("paper", "hermes").budget_tokens == 4096
    assert (h.recency_rate, h.recency_rate_deep, h.omega0, h.omega_gamma, h.schedule_end) == (20.0, 0.5, 1.0, 0.9, "first_deep")
    assert (h.pseudo_queries, h.chunk_frames) == ("live", 16)
    m = preset_memory_config("paper", "mukv").mukv
    assert (m.retrieve_patch, m.retrieve_frame, m.retrieve_segment) == (20, 32, 12)
    assert (m.keep_patch, m.keep_frame, m.keep_segment, m.alpha_patch, m.alpha_frame, m.alpha_segment) == (0.1, 0.1, 0.8, 0.5, 0.7, 0.8)
    assert all(preset_memory_config("paper", p).tgvkv.keep_ratio == 0.05 for p in POLICIES)
    # Only the policy's own values: the paper ReKV leaves HERMES' budget alone.
    assert preset_memory_config("paper", "rekv").budget_tokens == MemoryConfig().budget_tokens
    assert set(PAPER) == set(POLICIES)

# --- every field's `paper` value: the seed's, or a departure declared in docs/POLICIES.md (issue 44) ---

SEED, OURS = "seed", "ours"  # the seed's value; no seed has it, or only a mechanism paper turns off reads it
_GUIDANCE = StreamKVConfig().guidance_prompt
# Every field of MemoryConfig and its sections -> {policy: (source, value)}: source is SEED, OURS or the
# number of a departure kept under `paper` (docs/POLICIES.md). A policy not named keeps the robot value
# (the preset gives a policy its own values only). Written from the seeds and the authors' code, not read
# from presets.py: a field added to the config without a row here fails below.
PAPER_FIELDS: dict[str, dict[str, tuple[str, object]]] = {
    "policy": {}, "preset": {},  # the choice itself, checked apart
    "question_stage": {p: (OURS, "none") for p in POLICIES},
    "budget_tokens": {"hermes": (SEED, 4096), **{p: (OURS, 16384) for p in ("full", "rekv", "streamkv", "mukv")}},
    "offload_bytes": {p: ("P1", 1 << 30) for p in ("rekv", "streamkv", "mukv")},
    "local_window_tokens": {"rekv": ("P13", 15000), "streamkv": ("P5", 15000), "mukv": ("P5", 15000)},  # 15K: the seeds'; P5/P13 how it is counted
    "retrieve_frames": {"rekv": (SEED, 64)},
    "prefill_batch": {p: (OURS, 4) for p in POLICIES},
    "page_tokens": {p: (OURS, 4) for p in POLICIES},
    "max_question_tokens": {p: (OURS, 512) for p in POLICIES},
    **{f"snapshot_{n}": {} for n in ("dir", "on_shutdown", "period_s", "keep")}, "restore_on_start": {},
    "rekv.query": {"rekv": ("P14", "question")},
    "rekv.question_window": {"rekv": (SEED, False)},
    "rekv.selection": {"rekv": (SEED, "layer")},
    "rekv.rerank": {"rekv": (SEED, 0)}, "rekv.contrast": {"rekv": (SEED, 0)}, "rekv.words": {"rekv": (SEED, 0.0)},
    "rekv.rerank_keep": {"rekv": (OURS, 0.5)},
    "streamkv.similarity_threshold": {"streamkv": (SEED, 0.99)},
    "streamkv.similarity": {"streamkv": (SEED, "mean")},  # the code's, with which the threshold was set
    "streamkv.min_segment_frames": {"streamkv": (SEED, 4)},
    "streamkv.max_segment_frames": {"streamkv": (SEED, 64)},
    "streamkv.max_segment_s": {"streamkv": (SEED, 0.0)},  # issue 44 item 1: no time cap, M = 64 reached
    "streamkv.summary_frames": {"streamkv": (SEED, True)},
    "streamkv.compression_ratio": {"streamkv": ("P3", 0.6)},
    "streamkv.retrieve_frames": {"streamkv": ("P4", 8)},
    "streamkv.split": {"streamkv": ("P2", "code")},
    "streamkv.guidance_prompt": {"streamkv": ("P6", _GUIDANCE)},
    "hermes.shallow_ratio": {"hermes": (SEED, 0.1)}, "hermes.deep_ratio": {"hermes": (SEED, 0.3)},
    "hermes.recency_rate": {"hermes": (SEED, 20.0)}, "hermes.recency": {"hermes": (SEED, "token")},
    "hermes.budget_rule": {"hermes": (SEED, "script")}, "hermes.recency_rate_deep": {"hermes": (SEED, 0.5)},
    "hermes.omega0": {"hermes": (SEED, 1.0)}, "hermes.omega_gamma": {"hermes": (SEED, 0.9)},
    "hermes.schedule_end": {"hermes": (SEED, "first_deep")},
    "hermes.smoothing_shallow": {"hermes": ("P10", 0.1)}, "hermes.smoothing_middle": {"hermes": ("P10", 0.3)},
    "hermes.smoothing_deep": {"hermes": ("P10", 0.4)},
    "hermes.chunk_frames": {"hermes": (SEED, 16)},
    "hermes.summary_token": {"hermes": ("P8", True)},
    "hermes.reindex": {"hermes": (SEED, "lazy")}, "hermes.reindex_at": {"hermes": ("P9", 0.9)},
    "hermes.pseudo_query": {"hermes": (OURS, HermesConfig().pseudo_query)},
    "hermes.pseudo_queries": {"hermes": (SEED, "live")},
    "hermes.local_query": {"hermes": ("P7", HermesConfig().local_query)}, "hermes.global_query": {"hermes": ("P7", HermesConfig().global_query)},
    "mukv.granularities": {"mukv": (SEED, ("patch", "frame", "segment"))},
    "mukv.patch_split": {"mukv": (SEED, 4)}, "mukv.segment_frames": {"mukv": (SEED, 4)},
    **{f"mukv.{k}_{g}": {"mukv": (SEED, v)} for k, vals in (("alpha", (0.5, 0.7, 0.8)), ("keep", (0.1, 0.1, 0.8)),
                                                       ("retrieve", (20, 32, 12)), ("rerank", (0.3, 0.3, 0.0)))
       for g, v in zip(("patch", "frame", "segment"), vals)},
    "mukv.top_segments": {"mukv": (SEED, 5)}, "mukv.over_retrieval": {"mukv": (SEED, 2)},
    "tgvkv.keep_ratio": {p: (SEED, 0.05) for p in POLICIES},
    "redundancy.enabled": {p: (SEED, False) for p in POLICIES},  # every seed encodes every sampled frame
    "redundancy.max_cell_diff": {}, "redundancy.max_mean_diff": {}, "redundancy.grid": {},  # read only when enabled
}


def _flat_fields(cfg) -> dict[str, object]:
    out = {}
    for f in fields(cfg):
        value = getattr(cfg, f.name)
        out.update({f"{f.name}.{g.name}": getattr(value, g.name) for g in fields(value)} if is_dataclass(value) else {f.name: value})
    return out


def _declared_departures() -> dict[str, str]:
    """docs/POLICIES.md's "Departures kept under `paper`": number -> the item's text."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "POLICIES.md").read_text()
    section = text.split("### Departures kept under `paper`", 1)[1].split("\n## ", 1)[0]
    items = re.split(r"^- \*\*(P\d+)\*\*", section, flags=re.M)
    return {items[i]: items[i + 1] for i in range(1, len(items), 2)} | {OURS: items[-1].split("\n\n")[-1]}


def test_every_field_is_the_seeds_or_a_declared_departure_under_paper():
    robot = _flat_fields(MemoryConfig())
    assert sorted(PAPER_FIELDS) == sorted(robot), "each config field needs a row in PAPER_FIELDS"
    declared = _declared_departures()
    for policy in POLICIES:
        paper = _flat_fields(preset_memory_config("paper", policy))
        assert (paper.pop("policy"), paper.pop("preset")) == (policy, "paper")
        for name, value in paper.items():
            source, expected = PAPER_FIELDS[name].get(policy, (OURS, robot[name]))
            assert value == expected, f"{policy}: memory.{name} is {value!r} under paper, the table says {expected!r} ({source})"
            if source == SEED:
                continue
            assert source in declared, f"memory.{name} cites {source}, not in docs/POLICIES.md's list"
            if source == OURS and name not in _own_fields(policy):
                continue  # another policy's field: "every field of a policy other than the one in use"
            section, _, last = name.rpartition(".")
            stem = re.sub(r"_(shallow|middle|deep)$", "_*", last)
            # The item names the field: in full, by its last part, or as its section's "<section>.*".
            assert any(w in declared[source] for w in (name, f"`{last}`", f"`{section}.{stem}`", f"`{section}.*`") if w), (
                f"{source} in docs/POLICIES.md does not name memory.{name}")


def _own_fields(policy: str) -> set[str]:
    """The fields the table gives ``policy`` a value for (its own, and the ones every policy reads)."""
    return {name for name, per in PAPER_FIELDS.items() if policy in per}


def test_the_departure_list_is_numbered_once_and_in_order():
    numbers = [int(n[1:]) for n in _declared_departures() if n != OURS]
    assert numbers == list(range(1, len(numbers) + 1))
    cited = {src for per in PAPER_FIELDS.values() for src, _ in per.values()} - {SEED, OURS}
    assert cited <= set(_declared_departures())


def test_streamkv_paper_segments_merge_past_m_instead_of_closing_by_time(tiny_adapter):
    """Item 1: at 0.5 fps (2 s apart) identical frames never cross the threshold; the robot's 30 s cap
    closes the segment after 16 frames, paper keeps it open and merges past M (4 here) members."""
    from videokv_node.memory.policies.factory import make_policy
    from videokv_node.memory.policies.base import Unit

    feat = tiny_adapter.encode_frames([random_frames(1, seed=5)[0].rgb])[0]  # (T, hidden), the same every frame
    offsets = tiny_adapter.text_positions(0, tiny_adapter.tokens_per_frame)  # (P, T)

    def run(preset: str) -> tuple[list[int], int]:
        cfg = preset_memory_config(preset, "streamkv", local_window_tokens=16, **{"streamkv.max_segment_frames": 4})
        policy = make_policy(cfg, tiny_adapter)
        closed = []
        for i in range(40):
            jobs = policy.on_frame(None, Unit(feat=feat, offsets=offsets, camera="c", stamp_ns=i * 2_000_000_000))
            closed += [len(j.units) for j in jobs]
        return closed, len(policy.segmenter.pending)

    assert preset_memory_config("paper", "streamkv").streamkv.max_segment_s == 0.0
    assert MemoryConfig().streamkv.max_segment_s == 30.0  # robot, the node's default, unchanged
    robot_closed, _ = run("robot")
    assert robot_closed == [4 + 1, 4 + 1]  # frames 0-15 and 16-31 (30 s spans), each merged to 4 members + summary
    paper_closed, open_members = run("paper")
    assert paper_closed == [] and open_members == 4  # one open segment of 40 frames merged into M = 4 members


def test_an_explicit_value_wins_over_the_preset():
    cfg = preset_memory_config("paper", "rekv", retrieve_frames=16, **{"rekv.query": "prompt"})
    assert (cfg.retrieve_frames, cfg.rekv.query, cfg.local_window_tokens, cfg.rekv.question_window) == (16, "prompt", 15000, False)
    cfg = preset_memory_config("paper", "hermes", hermes=HermesConfig(chunk_frames=1))  # a section given whole is explicit
    assert cfg.hermes.chunk_frames == 1 and cfg.hermes.pseudo_queries == "probe" and cfg.budget_tokens == 4096
    with pytest.raises(ConfigError, match="memory.preset"):
        preset_memory_config("papers", "rekv")
    with pytest.raises(ConfigError, match="unknown parameter"):
        preset_memory_config("paper", "rekv", **{"rekv.nope": 1})

def test_eval_parameters_take_the_preset_under_explicit_ones():
    paper = engine_settings({"memory.preset": "paper", "memory.policy": "hermes"}).memory
    assert (paper.preset, paper.budget_tokens, paper.hermes.pseudo_queries, paper.hermes.recency_rate_deep) == ("paper", 4096, "live", 0.5)
    mine = engine_settings({"memory.preset": "paper", "memory.policy": "hermes", "memory.budget_tokens": 8000,
                            "memory.hermes.pseudo_queries": "probe"}).memory
    assert (mine.budget_tokens, mine.hermes.pseudo_queries, mine.hermes.omega_gamma) == (8000, "probe", 0.9)
    assert engine_settings({"memory.policy": "hermes"}).memory == MemoryConfig(policy="hermes")
    with pytest.raises(ConfigError, match="memory.preset"):
        engine_settings({"memory.preset": "lab"})

# --- ReKV: init tokens + top-k of all blocks, retrieved with the question's own tokens ---------

def test_question_span_is_the_question_text(tiny_adapter):
    a = tiny_adapter
    for options in ([], ["a red box", "a ball"]):
        q = "where is the red box?"
        ids = a.question_ids(q, options)
        own = a.text_ids(q)
        # Reference: the question's tokens found as a run in the prompt (the template around them differs).
        start = next(i for i in range(len(ids)) if ids[i : i + len(own)] == own)
        assert question_span(a, q, options) == slice(start, start + len(own))

def test_query_capture_averages_the_given_rows_only():
    cap = QueryCapture(n_q_heads=4, n_kv_heads=2, head_dim=1, rows=slice(1, 3))
    q = torch.arange(20, dtype=torch.float32).view(1, 5, 4)  # (B, n = 5 tokens, H_q * D = 4)
    cap.hook(0)(None, None, q)
    # rows 1 and 2: [4, 5, 6, 7] and [8, 9, 10, 11] -> token mean [6, 7, 8, 9] -> kv groups (6+7)/2, (8+9)/2
    torch.testing.assert_close(cap.mean(0), torch.tensor([[6.5], [8.5]]))

def test_rekv_paper_retrieves_from_all_blocks_with_the_question_tokens(tiny_adapter64):
    """Layer 0's query depends only on the prompt's embeddings: the top-k of every block by the mean
    pre-RoPE query of the question's own tokens is recomputed from the model's modules."""
    a = tiny_adapter64
    T = a.tokens_per_frame
    cfg = preset_memory_config("paper", "rekv", local_window_tokens=T, retrieve_frames=2, budget_tokens=100_000, page_tokens=1)
    engine = VideoMemoryEngine(a, cfg, GenerationConfig())
    for f in random_frames(8, seed=11):
        engine.ingest([f])
    question = "which frame had the most red?"
    engine.ask(Question(question, max_new_tokens=1))

    ids = a.question_ids(question, [])
    own = a.text_ids(question)
    start = next(i for i in range(len(ids)) if ids[i : i + len(own)] == own)
    lm = a.model.model.language_model
    geo = a.geometry
    with torch.no_grad():
        hidden = lm.layers[0].input_layernorm(a.embed_tokens(ids))
        q_all = lm.layers[0].self_attn.q_proj(hidden)[0].view(-1, geo.n_q_heads, geo.head_dim)  # (n, H_q, D)

    def top2(rows: slice) -> list[int]:
        q = q_all[rows].mean(0).view(geo.n_kv_heads, -1, geo.head_dim).mean(1)  # (H_kv, D)
        blocks = list(engine.store.blocks())
        scores = [float((q.double() * ref.pre_rope_key_mean(a, b.layers[0].keys, b.positions[0])).sum()) for b in blocks]
        return sorted(blocks[i].block_id for i in sorted(range(len(blocks)), key=lambda i: -scores[i])[:2])

    expected = top2(slice(start, start + len(own)))
    assert engine.last_layer_blocks[0] == expected  # no recent window: exactly the 2 retrieved
    assert all(len(blocks) == 2 for blocks in engine.last_layer_blocks)
    if top2(slice(None)) != expected:  # the robot query (whole prompt) would have picked otherwise
        robot = VideoMemoryEngine(a, MemoryConfig(policy="rekv", local_window_tokens=T, retrieve_frames=2, budget_tokens=100_000,
                                                  page_tokens=1, rekv=cfg.rekv.__class__(question_window=False, selection="layer")), GenerationConfig())
        for f in random_frames(8, seed=11):
            robot.ingest([f])
        robot.ask(Question(question, max_new_tokens=1))
        assert robot.last_layer_blocks[0] == top2(slice(None))

# --- StreamKV: adjacent-frame similarity of the mean features ------------------------------

def _segments(similarity: str, frames: list[torch.Tensor]) -> list[list[int]]:
    seg = SemanticSegmenter(SegmenterConfig(threshold=0.99, min_frames=1, max_frames=64, similarity=similarity))
    out = []
    for i, f in enumerate(frames):
        out += [s.item_ids for s in seg.push(i, f)]
    return out + [[i for m in seg.pending for i in m.item_ids]]

def test_mean_and_token_similarity_split_a_stream_differently():
    # Tokens swapped: flattened cosine (0 + 0) / (1 * 1)... = 0 -> a boundary; both means (0.5, 0.5) -> 1, none.
    swap = [torch.tensor([[1.0, 0.0], [0.0, 1.0]]), torch.tensor([[0.0, 1.0], [1.0, 0.0]])]
    assert _segments("tokens", swap) == [[0], [1]]
    assert _segments("mean", swap) == [[0, 1]]
    # Flattened: (100*100 + 99*99 - 1) / (100^2 + 99^2 + 1) = 19800 / 19802 > 0.99 -> none;
    # means (0.5, 0.5) and (0.5, -0.5) are orthogonal -> a boundary.
    small = [torch.tensor([[100.0, 0.0], [-99.0, 1.0]]), torch.tensor([[100.0, 0.0], [-99.0, -1.0]])]
    assert 19800 / 19802 > 0.99
    assert _segments("tokens", small) == [[0, 1]]
    assert _segments("mean", small) == [[0], [1]]

def test_streamkv_policy_segments_by_its_configured_similarity(tiny_adapter):
    from videokv_node.memory.policies.factory import make_policy

    cfg = preset_memory_config("paper", "streamkv", local_window_tokens=16)
    assert make_policy(cfg, tiny_adapter).segmenter.config.similarity == "mean"
    assert make_policy(MemoryConfig(policy="streamkv", streamkv=StreamKVConfig()), tiny_adapter).segmenter.config.similarity == "tokens"

# --- HERMES: the schedule and the live pseudo-queries -----------------------------------------

def test_middle_rate_schedule_hand_computed():
    from videokv_node.memory.scoring.hermes import schedule_rate

    # 28 layers as in the script: shallow 0-1, middle 2-18, first deep 19; progress = (l - 2) / 17.
    assert schedule_rate(2, 2, 19, 20.0, 0.5) == 20.0
    assert schedule_rate(19, 2, 19, 20.0, 0.5) == pytest.approx(0.5)
    assert schedule_rate(10, 2, 19, 20.0, 0.5) == pytest.approx(20 - 19.5 * 8 / 17)
    assert schedule_rate(10, 2, 18, 20.0, 20.0) == 20.0  # robot: fixed

def eager_attentions(a, frames, text: str) -> tuple[list[torch.Tensor], int]:
    """transformers' own eager attention over [prompt, frames, text] in one plain forward: per layer
    (H_q, n, K) attention of the text's tokens, and the number of text tokens."""
    lm = a.model.model.language_model
    feats = a.encode_frames([f.rgb for f in frames])  # (F, T, hidden)
    ids = a.text_ids(text)
    embeds = torch.cat([a.embed_tokens(a.prefix_ids()), feats.reshape(1, -1, feats.shape[-1]), a.embed_tokens(ids)], dim=1)
    saved = lm.config._attn_implementation
    lm.config._attn_implementation = "eager"
    try:
        with torch.no_grad():
            out = lm(inputs_embeds=embeds, position_ids=torch.arange(embeds.shape[1])[None], output_attentions=True, use_cache=False)
    finally:
        lm.config._attn_implementation = saved
    return [att[0, :, -len(ids) :] for att in out.attentions], len(ids)

def _rotate(lm, keys: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """Post-RoPE keys (H, N, D) moved by ``delta`` (N,) positions with transformers' own rotary code."""
    from transformers.models.qwen2.modeling_qwen2 import apply_rotary_pos_emb

    cos, sin = lm.rotary_emb(keys[None], delta[None])
    moved, _ = apply_rotary_pos_emb(keys[None], keys[None], cos, sin)
    return moved[0]

@pytest.mark.parametrize(
    "roles_cfg",
    [dict(omega0=0.6), dict(schedule_end="last_middle"), dict(shallow_ratio=0.5, deep_ratio=0.5),
     dict(shallow_ratio=0.5, deep_ratio=0.5, recency="frame", budget_rule="hard_cap")],
    ids=["middle+deep", "lone-middle", "shallow+deep", "shallow+deep-robot-rules"],
)
def test_hermes_paper_keeps_what_the_live_pseudo_queries_score(tiny_adapter64, roles_cfg):
    """One compression of the paper preset recomputed from scratch: the global (deep) and "local;
    global" (middle) queries' attention from transformers' eager forward over the live cache, the
    forgetting curve, sum-normalisation, the omega mix, smoothing towards the next layer by token,
    top-k per layer, and the deep layer's pruned tokens folded into the summary token. The script's
    rules (paper): kv_size = budget_tokens video tokens kept, the sink not counted, and token j of the
    layer's N scored exp(-k (N-1-j) / (N-1)); the robot's: the sink counted, a frame's age over the oldest."""
    a = tiny_adapter64
    T, S = a.tokens_per_frame, len(a.prefix_ids())
    script = roles_cfg.get("budget_rule", "script") == "script"
    cfg = preset_memory_config("paper", "hermes", budget_tokens=(0 if script else S) + 3 * T + 2, local_window_tokens=T, page_tokens=1,
                               **{"hermes.chunk_frames": 1, **{f"hermes.{k}": v for k, v in roles_cfg.items()}})
    h = cfg.hermes
    e = VideoMemoryEngine(a, cfg, GenerationConfig())
    frames = scene(4, seed=3)
    for f in frames:
        e.ingest([f])
    assert e.policy.compressions == 1  # 4 frames > 3 T + 1 tokens a deep layer holds besides its summary
    roles = e.policy.roles
    L = len(roles)
    # Before the compression every layer held the 4 frames, at the positions a plain forward gives them.
    glob, n_g = eager_attentions(a, frames, h.global_query)
    mixed, n_m = eager_attentions(a, frames, f"{h.local_query}; {h.global_query}")
    N = 4 * T
    if h.recency == "token":  # HERMES' script: (N - 1 - j) / (N - 1), each token's place from the newest
        ages, oldest = torch.tensor([N - 1 - t for t in range(N)], dtype=torch.float64), N - 1
    else:  # robot: frames since the token's frame over the oldest frame's age (frame 0 oldest)
        ages, oldest = torch.tensor([3 - t // T for t in range(N)], dtype=torch.float64), 3

    def norm(x):
        return x / x.sum()

    raw = []
    first_middle = roles.index("middle") if "middle" in roles else 0
    first_deep = roles.index("deep")
    # Depth reaches 1 at the first deep layer (script) or the last middle one (ours; a lone middle layer sits at 0.5).
    end = first_deep if h.schedule_end == "first_deep" else first_deep - 1
    for l, role in enumerate(roles):
        progress = (0.5 if end == first_middle else (l - first_middle) / (end - first_middle)) if role == "middle" else 0.0
        rate = h.recency_rate + (h.recency_rate_deep - h.recency_rate) * progress if role == "middle" else h.recency_rate
        rec = torch.exp(-rate * ages / oldest)
        if role == "shallow":
            raw.append(norm(rec))
            continue
        att = (glob if role == "deep" else mixed)[l][:, :, S : S + N].double().mean(dim=(0, 1))
        if role == "deep":
            raw.append(norm(att))
        else:
            w = min(1.0, max(0.0, h.omega0 - h.omega_gamma * progress))
            raw.append((1 - w) * norm(att) + w * norm(rec))
    lam = {"shallow": h.smoothing_shallow, "middle": h.smoothing_middle, "deep": h.smoothing_deep}
    smooth = [(1 - lam[roles[l]]) * raw[l] + lam[roles[l]] * raw[l + 1] for l in range(L - 1)] + [raw[-1]]
    blocks = sorted((b for b in e.store.blocks() if b.kind != "summary"), key=lambda b: b.order)
    for l, role in enumerate(roles):
        n_keep = 3 * T + 2 - (1 if role == "deep" else 0)
        order = sorted(range(N), key=lambda t: -float(smooth[l][t]))
        want = sorted(order[:n_keep])
        got = sorted(blocks.index(b) * T + int(i) for b in blocks if b.layers[l] is not None for i in b.layers[l].index)
        assert got == want, f"layer {l} ({role})"
        if role != "deep":
            continue
        # Summary: mean of the pruned keys moved to position S (transformers' rotary code), mean of their values.
        pruned = sorted(set(range(N)) - set(want))
        ref = e.policy.summary.layers[l]
        lm = a.model.model.language_model
        plain_keys, plain_values = _plain_kv(a, frames, l)
        k = _rotate(lm, plain_keys[:, [S + t for t in pruned]], torch.tensor([S - (S + t) for t in pruned])).mean(1)
        # transformers computes cos/sin in float32 (here and in the forward), hence 1e-6, not float64's 1e-9.
        torch.testing.assert_close(ref.keys[:, 0].double(), k.double(), rtol=0, atol=1e-6)
        torch.testing.assert_close(ref.values[:, 0].double(), plain_values[:, [S + t for t in pruned]].mean(1).double(), rtol=0, atol=1e-6)

def _plain_kv(a, frames, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(H, S + F T, D) keys and values of [prompt, frames] from one plain forward."""
    from transformers.cache_utils import DynamicCache

    feats = a.encode_frames([f.rgb for f in frames])
    embeds = torch.cat([a.embed_tokens(a.prefix_ids()), feats.reshape(1, -1, feats.shape[-1])], dim=1)
    cache = DynamicCache()
    with torch.no_grad():
        a.forward(embeds, torch.arange(embeds.shape[1]), cache, logits=False)
    return cache.layers[layer].keys[0], cache.layers[layer].values[0]

def test_live_pseudo_queries_differ_from_the_prompt_only_probe(tiny_adapter64):
    """The live queries see the frames: their attention is not what one probe over the prompt alone gives."""
    a = tiny_adapter64
    T, S = a.tokens_per_frame, len(a.prefix_ids())
    base = dict(budget_tokens=3 * T + 2, local_window_tokens=T, page_tokens=1)  # the script's kv_size: the sink not counted
    kept = {}
    for mode in ("probe", "live"):
        cfg = preset_memory_config("paper", "hermes", **base, **{"hermes.chunk_frames": 1, "hermes.pseudo_queries": mode,
                                                                "hermes.pseudo_query": "Summarize the video narrative, identifying main characters, key events, timeline changes, and the overall theme."})
        e = VideoMemoryEngine(a, cfg, GenerationConfig())
        for f in scene(6, seed=4):
            e.ingest([f])
        deep = e.policy.roles.index("deep")
        kept[mode] = sorted((b.order, int(i)) for b in e.store.blocks() if b.kind != "summary" and b.layers[deep] is not None
                            for i in b.layers[deep].index)
    assert kept["probe"] != kept["live"]


@pytest.mark.parametrize("policy", POLICIES)
def test_every_paper_preset_runs_on_both_model_families(tiny_adapter, tiny_qwen, policy):
    """The paper values hold on the tiny LLaVA-OV and Qwen2.5-VL (mRoPE); HERMES compresses with live queries."""
    for a in (tiny_adapter, tiny_qwen):
        T, S = a.tokens_per_frame, len(a.prefix_ids())
        explicit = {"budget_tokens": 4 * T + 2, "local_window_tokens": T, "hermes.chunk_frames": 1} if policy == "hermes" else {}
        e = VideoMemoryEngine(a, preset_memory_config("paper", policy, **explicit), GenerationConfig(max_new_tokens=2))
        for f in scene(6, seed=1):
            e.ingest([f])
        answer = e.ask(Question("what is there?", max_new_tokens=2))
        assert answer.evidence
        if policy == "hermes":
            assert e.policy.compressions >= 1


def test_hermes_script_budget_rule_keeps_kv_size_at_each_chunk_end(tiny_adapter64):
    """HERMES' script (paper preset): a layer may grow past kv_size (= budget_tokens video tokens, the
    sink not counted) within a chunk; at a chunk's end, once a layer is over it, every layer is cut back
    to exactly kv_size (deep: kv_size - 1 and the summary token). Never above kv_size + one chunk."""
    a = tiny_adapter64
    T = a.tokens_per_frame
    kv_size, chunk = 3 * T + 2, 2
    cfg = preset_memory_config("paper", "hermes", budget_tokens=kv_size, local_window_tokens=T, page_tokens=1,
                               **{"hermes.chunk_frames": chunk, "hermes.pseudo_queries": "probe"})
    assert (cfg.hermes.budget_rule, cfg.hermes.recency) == ("script", "token")
    e = VideoMemoryEngine(a, cfg, GenerationConfig())
    roles, compressions = e.policy.roles, []
    for n, f in enumerate(scene(9, seed=5), start=1):
        e.ingest([f])
        held = [sum(b.layer_tokens(l) for b in e.store.blocks() if b.kind != "summary") for l in range(len(roles))]
        assert max(held) <= kv_size + chunk * T
        if e.policy.compressions > len(compressions):
            compressions.append(n)
            assert held == [kv_size - (1 if r == "deep" else 0) for r in roles]
    # Frames 1-4 hold 4 T > kv_size at frame 4 (a chunk's end): compressions there and every chunk after.
    assert compressions == [4, 6, 8]


# --- declared departures, pinned (docs/POLICIES.md "Departures kept under `paper`") -----------------

def test_p5_streamkv_paper_window_holds_the_blocks_as_compressed(tiny_adapter):
    """P5: under paper a layer's encoding window lacks the frame blocks SelectKV dropped there (the code's
    would hold every frame raw): each layer holds ceil((1 - theta) T_i) of each segment's T_i frames."""
    from videokv_node.memory.context.encoding import EncodeJob

    a = tiny_adapter
    T, L, sink = a.tokens_per_frame, a.geometry.n_layers, len(a.prefix_ids())
    cfg = preset_memory_config("paper", "streamkv", local_window_tokens=60 * T, budget_tokens=sink + 200 * T,
                               **{"streamkv.min_segment_frames": 4, "streamkv.max_segment_frames": 8,
                                  "streamkv.split": "softmax", "streamkv.compression_ratio": 0.5})
    e = VideoMemoryEngine(a, cfg, GenerationConfig(max_new_tokens=1))
    made = {}
    for f in scene(30, seed=9, scene_len=6):
        made.update({b.block_id: b for b in e.ingest([f])})  # every block made, those evicted since included
    window = {b.block_id for b in e.policy.encoding_context(e.store, EncodeJob([]))}
    segments, current = [], []
    for b in sorted(made.values(), key=lambda b: b.order):  # time order: a segment's frames, then its summary
        if b.kind == "summary":
            segments.append(current)
            current = []
        else:
            current.append(b)
    assert len(segments) >= 3 and all(b.block_id in window for frames in segments for b in frames if b in e.store)
    for frames in segments:
        held = [sum(b in e.store and b.block_id in window and b.layers[l] is not None for b in frames) for l in range(L)]
        assert sum(held) == -(-len(frames) // 2) * L  # ceil(0.5 T_i) x L, as compressed
        assert all(h < len(frames) for h in held)  # a raw window would hold all T_i frames in every layer
    e.close()


def test_p8_hermes_paper_summary_token_stands_after_the_sink_and_is_never_scored(tiny_adapter64):
    """P8: one summary token per deep layer at the position right after the sink, kept through every
    compression (the script's is appended after the newest kept token and may be pruned)."""
    from videokv_node.memory.scoring.hermes import layer_roles

    a = tiny_adapter64
    T, sink = a.tokens_per_frame, len(a.prefix_ids())
    cfg = preset_memory_config("paper", "hermes", budget_tokens=3 * T, local_window_tokens=T, **{"hermes.chunk_frames": 2})
    e = VideoMemoryEngine(a, cfg, GenerationConfig(max_new_tokens=1))
    roles = layer_roles(a.geometry.n_layers, cfg.hermes.shallow_ratio, cfg.hermes.deep_ratio)
    assert "deep" in roles
    seen = set()
    for f in random_frames(12, seed=3):
        e.ingest([f])
        summary = e.policy.summary
        if summary is None:
            continue
        seen.add(summary.block_id)
        assert summary in e.store and summary.protected
        for l, role in enumerate(roles):
            kv = summary.layers[l]
            if role != "deep":
                assert kv is None
                continue
            assert kv.n_tokens == 1 and int(kv.logical.reshape(-1)[0]) == sink  # right after the sink
    assert len(seen) == 1  # one summary token for the stream, never pruned nor replaced
    e.close()
