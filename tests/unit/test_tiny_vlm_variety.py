"""videokv-tiny v3's varied training data (tinyvlm/variety.py) and its held-out evaluation:
sizes, backgrounds, free placement without overlap, wordings, the letter-format multiple choice,
and that training never draws what the evaluation holds out."""

from __future__ import annotations

import hashlib
from collections import Counter

import numpy as np
import pytest
import torch
from transformers import LlamaForCausalLM

from videokv_node.models.tiny_tokenizer import build_tiny_tokenizer
from videokv_node.models.videokv_tiny import Projector, VideoKVTinyAdapter, tiny_llama_config
from videokv_node.tinyvlm.dataset import build_examples
from videokv_node.tinyvlm.generalisation import DISC_COLOURS, disc_frames, generalisation_examples
from videokv_node.tinyvlm.looks import BACKGROUNDS, HELD_OUT_BACKGROUNDS, HELD_OUT_PHOTOS, Look, background
from videokv_node.tinyvlm.render import render
from videokv_node.tinyvlm.scenes import COLOURS, COUNT_WORDS, PHOTOS, SIZE, Scene, SceneSampler, Shape, cell_words, photo_dir
from videokv_node.tinyvlm.story import STORY
from videokv_node.tinyvlm.trainer import ProjectorTrainer
from videokv_node.tinyvlm.variety import (
    HELD_OUT_SIZES, HELD_OUT_WORDINGS, KINDS, OPTION_VALUES, SIZE_RANGE, WORDINGS, VariedSampler, fill_template,
    with_letter_options,
)


def photos_installed() -> bool:
    try:
        photo_dir()
    except FileNotFoundError:
        return False
    return True


needs_photos = pytest.mark.skipif(not photos_installed(), reason="scikit-image (its wheel ships the photos) not installed")
THIRDS = (SIZE / 3, 2 * SIZE / 3)


def all_wordings(table) -> set[str]:
    """Every question a table of templates can produce, filled with every colour and shape."""
    return {fill_template(t, c, s) for ts in table.values() for t in ts for c in COLOURS for s in ("circle", "square", "triangle")}


def draws(sampler: VariedSampler, n: int):
    return [sampler.question() for _ in range(n)]


# --- the first renderer is unchanged ---------------------------------------------------------------------
def test_column_scenes_render_as_before():
    """The demo story and the first held-out set keep their pixels: digest taken on main at 19f489d."""
    h = hashlib.sha256()
    for seg in STORY:
        for s in seg.scenes:
            h.update(render(s).tobytes())
    sampler = SceneSampler(5)
    for _ in range(10):
        h.update(render(sampler.frame_question().scenes[0]).tobytes())
    assert h.hexdigest() == "ec766f0a93344e46074d5845611cb2772f9631a389e47c5911fffb8d9fff04b7"


# --- sizes ------------------------------------------------------------------------------------------------
def test_training_sizes_span_a_few_percent_to_most_of_the_frame_and_skip_the_held_out_band():
    sides = [s.side / SIZE for ex in draws(VariedSampler(0), 600) for s in ex.scenes[0].shapes]
    lo, hi = HELD_OUT_SIZES
    assert not any(lo * SIZE <= v * SIZE < hi * SIZE for v in sides)  # in px, as drawn
    assert min(sides) < 0.13 and max(sides) > 0.7
    assert min(sides) >= SIZE_RANGE[0] - 1 / SIZE and max(sides) <= SIZE_RANGE[1] + 1 / SIZE
    assert sum(v < lo for v in sides) > 50 and sum(v >= hi for v in sides) > 50


def test_held_out_sizes_are_only_the_band():
    sides = [s.side / SIZE for ex in generalisation_examples(10, held_out=True) for s in ex.scenes[0].shapes]
    assert all(HELD_OUT_SIZES[0] - 1 / SIZE <= v <= HELD_OUT_SIZES[1] + 1 / SIZE for v in sides)


# --- placement ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("held_out", [False, True])
def test_several_shapes_are_placed_freely_inside_the_frame_and_never_overlap(held_out):
    scenes = [ex.scenes[0] for ex in draws(VariedSampler(3, held_out=held_out), 400) if ex.kind == "count"]
    counts = Counter(len(s.shapes) for s in scenes)
    assert set(counts) == {1, 2, 3}
    xs = []
    for scene in scenes:
        boxes = [(s.x - s.side / 2, s.y - s.side / 2, s.x + s.side / 2, s.y + s.side / 2) for s in scene.shapes]
        for x0, y0, x1, y1 in boxes:
            assert 0 <= x0 and 0 <= y0 and x1 <= SIZE and y1 <= SIZE
        for i in range(len(boxes)):
            for j in range(i + 1, len(boxes)):
                a, b = boxes[i], boxes[j]
                assert a[2] <= b[0] or b[2] <= a[0] or a[3] <= b[1] or b[3] <= a[1], (a, b)
        for s in scene.shapes:
            assert s.column == ("left" if s.x < THIRDS[0] else "middle" if s.x < THIRDS[1] else "right")
            assert min(abs(s.x - t) for t in THIRDS) >= 6
            xs.append(s.x)
    assert min(xs) < 40 and max(xs) > SIZE - 40  # free positions, not three columns


def test_a_free_shape_is_drawn_where_its_spec_says():
    """On a flat backdrop with no lighting, blur or noise, each shape's centre pixel has its colour."""
    sampler = VariedSampler(5)
    for _ in range(30):
        scene = sampler.question("count").scenes[0]
        plain = Scene(scene.shapes, seed=scene.seed, look=Look("flat"))
        rgb = render(plain).astype(int)
        for s in scene.shapes:
            px = rgb[s.y + (s.side // 4 if s.shape == "triangle" else 0), s.x]
            assert min(COLOURS, key=lambda c: np.abs(np.asarray(COLOURS[c]) - px).sum()) == s.colour
            assert np.abs(np.asarray(COLOURS[s.colour]) - px).max() <= 20


def test_free_shapes_have_column_words_naming_only_their_own_colour_and_shape():
    """v4: stage 1 aligns free shapes too (tests/unit/test_videokv_tiny_colour.py has the rule by hand)."""
    for seed in range(20):
        scene = VariedSampler(seed).question().scenes[0]
        words = cell_words(scene)
        assert len(words) == 6 and words != ["nothing"] * 6
        names = {(s.colour, s.shape) for s in scene.shapes} | {("nothing", "nothing")}
        assert all((words[2 * c], words[2 * c + 1]) in names for c in range(3))
    assert cell_words(Scene((Shape("red", "circle", "left"),))) is not None


# --- backgrounds, lighting, blur ----------------------------------------------------------------------------
@pytest.mark.parametrize("kind", [b for b in BACKGROUNDS + HELD_OUT_BACKGROUNDS if "photo" not in b])
def test_each_background_is_a_frame_of_its_kind(kind):
    a = background(kind, np.random.default_rng(0))
    b = background(kind, np.random.default_rng(1))
    assert a.shape == (SIZE, SIZE, 3) and a.min() >= 0 and a.max() <= 255
    assert not np.array_equal(a, b)  # drawn parameters differ by seed
    if kind == "flat":
        assert np.ptp(a.reshape(-1, 3), axis=0).max() == 0
    else:
        assert a.std() > 1


@needs_photos
def test_held_out_photos_are_shipped_and_never_trained_on():
    assert not set(HELD_OUT_PHOTOS) & {p.file for p in PHOTOS}
    for file in HELD_OUT_PHOTOS:
        assert (photo_dir() / file).is_file()
    assert background("unseen photo", np.random.default_rng(0)).shape == (SIZE, SIZE, 3)


def test_training_draws_every_training_background_and_no_held_out_one():
    seen = Counter(ex.scenes[0].look.background for ex in draws(VariedSampler(2), 300))
    assert set(seen) == set(BACKGROUNDS)
    held = Counter(ex.scenes[0].look.background for ex in generalisation_examples(20, held_out=True))
    assert set(held) == set(HELD_OUT_BACKGROUNDS)


def test_lighting_and_blur_vary():
    looks = [ex.scenes[0].look for ex in draws(VariedSampler(4), 200)]
    gains = [lk.gain for lk in looks]
    assert min(gains) < 0.7 and max(gains) > 1.2
    assert 0.3 < sum(lk.blur > 0 for lk in looks) / len(looks) < 0.7
    scene = Scene((Shape("red", "circle", "left", x=60, y=100, side=50),), seed=3, look=Look("flat", blur=2.0))
    sharp = render(Scene(scene.shapes, seed=3, look=Look("flat")))
    assert np.abs(render(scene).astype(int) - sharp).max() > 30  # the edge is softened


# --- wordings -------------------------------------------------------------------------------------------------
def test_held_out_wordings_are_never_drawn_in_training():
    assert not all_wordings(WORDINGS) & all_wordings(HELD_OUT_WORDINGS)
    trained = {ex.question for ex in draws(VariedSampler(6), 800)}
    assert not trained & all_wordings(HELD_OUT_WORDINGS)
    for kind in KINDS:  # many phrasings of each kind are drawn
        assert len({ex.question for ex in draws(VariedSampler(7), 400) if ex.kind == kind}) >= 6
    held = {ex.question for ex in generalisation_examples(10, held_out=True)}
    assert held <= all_wordings(HELD_OUT_WORDINGS)


def test_the_in_distribution_evaluation_draws_training_distributions_from_another_seed():
    evaluated = generalisation_examples(10, held_out=False)
    assert {ex.question for ex in evaluated} <= all_wordings(WORDINGS)
    assert all(ex.scenes[0].look.background in BACKGROUNDS for ex in evaluated)
    trained = {ex.scenes for ex in build_examples(0, 0, 0, 10, 2, n_varied=200, varied_pool=100)}
    assert not trained & {ex.scenes for ex in evaluated}


def test_answers_follow_the_scene():
    for ex in draws(VariedSampler(8), 200):
        s = ex.scenes[0].shapes[0]
        expected = {"colour": s.colour, "shape": s.shape, "position": s.column, "count": COUNT_WORDS[len(ex.scenes[0].shapes)]}
        assert ex.answer == expected[ex.kind]
        assert ex.kind == "count" or len(ex.scenes[0].shapes) == 1


# --- multiple choice in the letter format ---------------------------------------------------------------
def test_letter_options_hold_the_answer_once_under_its_letter():
    rng = np.random.default_rng(0)
    sizes = Counter()
    for ex in draws(VariedSampler(9), 200):
        mc = with_letter_options(ex, OPTION_VALUES[ex.kind], rng)
        assert len(set(mc.options)) == len(mc.options) and set(mc.options) <= set(OPTION_VALUES[ex.kind])
        assert mc.options["ABCD".index(mc.answer)] == ex.answer
        sizes[len(mc.options)] += 1
    assert set(sizes) == {2, 3, 4}
    letters = Counter(with_letter_options(ex, OPTION_VALUES[ex.kind], rng, n=3).answer for ex in draws(VariedSampler(9), 300))
    assert set(letters) == {"A", "B", "C"} and min(letters.values()) > 60  # the right letter is not always the same


def test_the_trainer_prompts_options_exactly_as_the_node_does():
    adapter = VideoKVTinyAdapter.tiny()
    tokenizer = adapter.tokenizer
    llm = LlamaForCausalLM(tiny_llama_config(tokenizer)).eval()
    trainer = ProjectorTrainer(llm, tokenizer, Projector(llm.config.hidden_size, mlp_dim=16), {})
    for question, options in [("What colour is the shape?", ("blue", "red")), ("Count the shapes.", ("one", "two", "three")),
                              ("Which way did the red circle move?", ())]:
        assert trainer.question_ids(question, options) == adapter.question_ids(question, list(options))


def test_build_examples_asks_a_share_as_letter_choices_and_keeps_the_questions():
    plain = build_examples(3, 40, 20, 30, 3, n_varied=60, varied_pool=20)
    mc = build_examples(3, 40, 20, 30, 3, n_varied=60, varied_pool=20, letter_share=0.4)
    assert Counter((ex.scenes, ex.question) for ex in plain) == Counter((ex.scenes, ex.question) for ex in mc)
    lettered = [ex for ex in mc if ex.options]
    assert 0.25 < len(lettered) / sum(ex.kind in OPTION_VALUES for ex in mc) < 0.55
    assert all(len(ex.answer) == 1 and ex.answer in "ABCDEFGHIJ" and ex.kind in OPTION_VALUES for ex in lettered)
    assert {ex.kind for ex in lettered} >= {"colour", "count", "first"}  # varied, column and stream questions


def test_the_trainer_runs_on_varied_and_letter_examples():
    tokenizer = build_tiny_tokenizer()
    torch.manual_seed(0)
    llm = LlamaForCausalLM(tiny_llama_config(tokenizer)).eval()
    projector = Projector(llm.config.hidden_size, mlp_dim=32)
    examples = build_examples(5, 4, 2, 10, 2, n_varied=6, varied_pool=4, letter_share=0.5)
    gen = torch.Generator().manual_seed(1)
    features = {s: torch.rand(*projector.pooled_shape, generator=gen) for ex in examples for s in ex.scenes}
    loss = ProjectorTrainer(llm, tokenizer, projector, features, align_weight=1.0).loss(examples)
    loss.backward()
    assert torch.isfinite(loss) and projector.fc1.weight.grad.abs().sum() > 0


# --- the other renderer's discs ------------------------------------------------------------------------------
def test_disc_frames_show_one_plain_disc_moving():
    frames = disc_frames("blue", seed=1)
    assert len(frames) == 6 and frames[0].shape == (240, 320, 3)
    for f in frames:
        blue = (np.abs(f.astype(int) - DISC_COLOURS["blue"]).sum(-1) == 0).mean()
        assert blue > 0.05  # a radius of 40 px or more
    assert not np.array_equal(frames[0], frames[1])


def test_the_generalisation_report_shows_both_models_per_set_and_kind():
    from videokv_node.tinyvlm.report import generalisation_report

    def results(model, acc):
        per = {k: {"examples": 3, "open": acc, "likelihood": acc, "letter": acc / 2} for k in KINDS}
        return {"model": model, "weights": "w", "generalisation": {"in distribution": per, "held out": per},
                "discs": {"examples": 8, "open": acc, "likelihood": acc, "letter": 0.25}}

    text = generalisation_report(results("v2", 0.5), results("v3", 0.75), "cmd")
    rows = [line for line in text.splitlines() if line.startswith("| held out |") or line.startswith("| in distribution |")]
    assert len(rows) == 2 * len(KINDS)
    assert all(row.endswith("| 0.50 | 0.50 | 0.25 | 0.75 | 0.75 | 0.38 |") for row in rows)
    assert "v2: open 0.50" in text and "v3: open 0.75" in text
