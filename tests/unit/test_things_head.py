"""v6's drawn-things head (models/things_head.py) and its words in the noun block (models/nouns.py ``extra``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from videokv_node.models.nouns import NounBlock, NounConfig, read_noun_table
from videokv_node.models.things_head import THING_COLOURS, THING_NAMES, THING_SHAPES, ThingHead
from videokv_node.models.tiny_tokenizer import build_tiny_tokenizer
from videokv_node.models.videokv_tiny import WEIGHTS_DIR, VideoKVTinyAdapter
from videokv_node.tinyvlm.scenes import COLOURS, SHAPES


def test_names_are_the_renderers():
    assert THING_COLOURS == tuple(COLOURS) and THING_SHAPES == SHAPES
    assert THING_NAMES[0] == "red circle" and len(THING_NAMES) == 12


def test_a_frames_logit_is_its_strongest_cell():
    torch.manual_seed(0)
    head = ThingHead(hidden=8)
    cells = torch.rand(2, 49, head.in_dim)
    per_cell = head.cell_logits(cells)
    expected = torch.stack([per_cell[b].max(0).values for b in range(2)])  # reference: a loop, not amax
    assert torch.allclose(head.logits_from_cells(cells), expected)
    maps, mid, px = torch.rand(1, 1280, 7, 7), torch.rand(1, 80, 14, 14), torch.rand(1, 3, 224, 224)
    assert head(maps, mid, px).shape == (1, 12)
    # a cell's colour statistics are the chroma-weighted mean colour: a pure red image gives (1, 0, 0) and chroma 1
    red = torch.zeros(1, 3, 224, 224)
    red[:, 0] = 1.0
    cells = head.cells(maps, mid, red)[0]
    assert torch.allclose(cells[:, -7:-3], torch.tensor([1.0, 0.0, 0.0, 1.0]).expand(49, 4), atol=1e-3)
    assert cells[:, -3:].max() < 2e-3  # one flat colour: no spread
    # half a cell's pixels red, half blue, both fully saturated: the spread of R and B is 0.5 (a reference by hand)
    mixed = torch.zeros(1, 3, 224, 224)
    mixed[:, 0, :, ::2] = 1.0
    mixed[:, 2, :, 1::2] = 1.0
    spread = head.cells(maps, mid, mixed)[0, :, -3:]
    assert torch.allclose(spread[:, 0], torch.full((49,), 0.5), atol=1e-3) and spread[:, 1].max() < 2e-3


@pytest.fixture(scope="module")
def block():
    tok = build_tiny_tokenizer()
    embed = torch.nn.Embedding(len(tok), 16)
    # slots of 16 tokens: the tests' tokenizer spells by characters, and its 3-token slots cut "green square" and
    # "graduation cap" to the same " gr" (SmolLM2's never cut a noun: tests/unit/test_noun_table.py)
    return NounBlock(read_noun_table(WEIGHTS_DIR / NounConfig().file), tok, embed,
                     NounConfig(extra_threshold=0.6, slot_tokens=16), extra=THING_NAMES)


def _logits(block: NounBlock, noun: str, p: float) -> torch.Tensor:
    """ImageNet logits whose softmax puts about ``p`` on the classes of ``noun``."""
    cls = int(block.class_to_noun[:, block.nouns.index(noun)].nonzero()[0])
    logits = torch.zeros(1, 1000)
    logits[0, cls] = float(np.log(p * 999 / (1 - p)))
    return logits


def test_a_drawn_thing_is_named_first_and_nouns_fill_the_rest(block):
    logits = _logits(block, "dog", 0.8)
    extra = torch.zeros(1, 12)
    extra[0, THING_NAMES.index("blue triangle")] = 0.9
    index, probs = block.top(logits, extra)
    assert block.names(index) == [["blue triangle", "dog"]]
    dog = logits.softmax(-1)[0, block.class_to_noun[:, block.nouns.index("dog")].bool()].sum()  # every dog class
    assert float(probs[0, 0]) == pytest.approx(0.9, rel=1e-6) and float(probs[0, 1]) == pytest.approx(float(dog), rel=1e-5)
    extra[0, THING_NAMES.index("red square")] = 0.7
    assert block.names(block.top(logits, extra)[0]) == [["blue triangle", "red square"]]
    extra[0] = 0.59  # every thing under the threshold: the classifier's nouns only
    assert block.names(block.top(logits, extra)[0]) == [["dog"]]


def test_extra_words_read_back_from_the_block(block):
    index = torch.tensor([[block.nouns.index("yellow circle"), block.nouns.index("dog")]])
    assert block.read(block.embed_slots(index)) == [("yellow circle", "dog")]


def test_extra_words_are_checked(block):
    tok = build_tiny_tokenizer()
    embed = torch.nn.Embedding(len(tok), 8)
    table = read_noun_table(WEIGHTS_DIR / NounConfig().file)
    with pytest.raises(ValueError, match="not the table's nouns"):
        NounBlock(table, tok, embed, extra=("dog",))
    with pytest.raises(ValueError, match="distinct"):
        NounBlock(table, tok, embed, extra=("red circle", "red circle"))
    with pytest.raises(ValueError, match="extra"):
        block.top(torch.zeros(1, 1000))


def test_the_adapter_writes_the_heads_words_into_every_frame():
    tiny = VideoKVTinyAdapter.tiny(colour_stats=True, things=True)
    assert tiny.tokens_per_frame == 6 + 6
    wide = NounBlock(read_noun_table(WEIGHTS_DIR / NounConfig().file), tiny.tokenizer, tiny.model.get_input_embeddings(),
                     NounConfig(slot_tokens=16), extra=THING_NAMES)  # as the fixture's: words read back unambiguously
    adapter = VideoKVTinyAdapter(tiny.encoder, tiny.projector, tiny.model, tiny.tokenizer, "videokv-tiny-random",
                                 tiny.image_size, nouns=wide, things=tiny.things)
    assert adapter.tokens_per_frame == 6 + 32
    with pytest.raises(ValueError, match="things head"):
        VideoKVTinyAdapter(tiny.encoder, tiny.projector, tiny.model, tiny.tokenizer, "x", tiny.image_size, nouns=None,
                           things=tiny.things)
    with torch.no_grad():  # force the head to see a green square everywhere
        adapter.things.fc2.bias.fill_(-30.0)
        adapter.things.fc2.bias[THING_NAMES.index("green square")] = 30.0
    frames = [np.full((48, 64, 3), v, np.uint8) for v in (10, 200)]
    feats = adapter.encode_frames(frames)
    assert [w[0] for w in adapter.frame_words(feats)] == ["green square", "green square"]
    assert [n[0][0] for n in adapter.frame_nouns(frames)] == ["green square", "green square"]
    with torch.no_grad():
        adapter.things.fc2.bias.fill_(-30.0)
    assert all("green square" not in w for w in adapter.frame_words(adapter.encode_frames(frames)))


def test_training_records_the_command_it_was_run_with(tmp_path, monkeypatch):
    """The head's report names its command, from the shell's arguments as from a caller's (the v6-head12k report
    had lost them: ``argv`` None recorded none)."""
    import json
    import sys

    from videokv_node.eval.footage import opencv_data_dir
    from videokv_node.models.efficientnet_lite import efficientnet_available
    from videokv_node.tinyvlm import train_things_head

    if opencv_data_dir() is None or not efficientnet_available():
        pytest.skip("needs opencv-doc's footage (scripts/setup_footage.sh) and the Lite0 wheel")
    args = ["--train-frames", "3", "--extra-frames", "1", "--eval-frames", "2", "--steps", "2", "--threads", "1",
            "--out", str(tmp_path)]
    monkeypatch.setattr(sys, "argv", ["train_things_head", *args])
    train_things_head.main()  # argv None: the shell's
    report = json.loads((tmp_path / "things-head.json").read_text())
    assert report["command"] == "python -m videokv_node.tinyvlm.train_things_head " + " ".join(args)
    assert (tmp_path / "things.safetensors").is_file() and report["frames"]["train"] == 4


def test_training_takes_colourful_frames_leaves_out_shape_drawings_and_records_both(tmp_path):
    import json

    from videokv_node.eval.footage import opencv_data_dir
    from videokv_node.models.efficientnet_lite import efficientnet_available
    from videokv_node.tinyvlm import train_things_head
    from videokv_node.tinyvlm.drawn import DrawnSampler

    if opencv_data_dir() is None or not efficientnet_available():
        pytest.skip("needs opencv-doc's footage (scripts/setup_footage.sh) and the Lite0 wheel")
    specs = DrawnSampler("train", 0).frames(60)  # the trainer's own draw (seed 0): its shape drawings counted here
    drawings = sum(f.source in ("pic2.png", "pic5.png") for f in specs)
    assert drawings > 0
    train_things_head.main(["--train-frames", "60", "--extra-frames", "0", "--colourful-frames", "3",
                            "--without-shape-drawings", "--cell-weight", "1.0", "--eval-frames", "2", "--steps", "2",
                            "--threads", "1", "--out", str(tmp_path)])
    report = json.loads((tmp_path / "things-head.json").read_text())
    assert report["frames"]["train"] == 60 - drawings + 3
    assert report["colourful_frames"] == 3 and report["without_shape_drawings"] and report["cell_weight"] == 1.0


def test_the_cell_weight_adds_the_cell_loss_to_the_step():
    """The same step (same seed, batch and start) with ``cell_weight`` 0 and 1 moves the head differently: the cell
    loss reaches the update (``--cell-weight`` is not silently ignored)."""
    from videokv_node.tinyvlm.train_things_head import fit

    torch.manual_seed(0)
    cells = torch.randn(4, 49, ThingHead().in_dim).half()
    y = torch.zeros(4, len(THING_NAMES))
    cy, cw = torch.zeros(4, 49, len(THING_NAMES)), torch.ones(4, 49, len(THING_NAMES))
    out = {}
    for weight in (0.0, 1.0):
        head = ThingHead(hidden=8)
        torch.manual_seed(1)
        head.load_state_dict({k: torch.randn_like(v) * 0.1 for k, v in head.state_dict().items()})
        fit(head, cells, y, steps=1, batch=4, lr=1e-2, seed=0, cells_y=(cy, cw), cell_weight=weight, log=lambda m: None)
        out[weight] = {k: v.clone() for k, v in head.state_dict().items()}
    assert not torch.equal(out[0.0]["fc1.weight"], out[1.0]["fc1.weight"])


def test_false_words_are_counted_per_source_on_frames_with_nothing_drawn():
    """A split's false words broken down by source, counted by hand: frames with a thing drawn never count, a frame
    with two words counts once among frames and once per word."""
    from videokv_node.tinyvlm.drawn import DrawnFrame, DrawnThing
    from videokv_node.tinyvlm.train_things_head import score

    def frame(source, things=()):
        return DrawnFrame(source, 0, (0.5, 0.5, 1.0), tuple(things), 1.0, (1.0, 1.0, 1.0), 0.0, 0.0, 0)

    red_triangle = THING_NAMES.index("red triangle")
    blue_triangle = THING_NAMES.index("blue triangle")
    frames = [frame("clip.mp4"), frame("clip.mp4"), frame("clip.mp4"), frame("photo.jpg"),
              frame("photo.jpg", [DrawnThing("red", "triangle", 0.5, 0.5, 0.3)])]
    probs = torch.zeros(len(frames), len(THING_NAMES))
    probs[0, red_triangle] = 0.97                              # clip: one word
    probs[1, red_triangle], probs[1, blue_triangle] = 0.99, 0.96  # clip: two words
    probs[2, blue_triangle] = 0.93                             # below 0.95: no word
    probs[4, red_triangle] = 0.99                              # drawn: not a false word, not counted
    got = score(probs, frames, 0.95)["false_words_by_source"]
    assert got == {"clip.mp4": {"frames": 3, "with_words": 2, "words": {"red triangle": 2, "blue triangle": 1}},
                   "photo.jpg": {"frames": 1, "with_words": 0, "words": {}}}
    assert score(probs, frames, 0.95)["false_word_rate"] == round(2 / 4, 4)


def test_things_named_are_counted_per_source():
    """Per source, the drawn things named, and those written with another colour, counted by hand."""
    from videokv_node.tinyvlm.drawn import DrawnFrame, DrawnThing
    from videokv_node.tinyvlm.train_things_head import score

    def frame(source, *things):
        return DrawnFrame(source, 0, (0.5, 0.5, 1.0), tuple(DrawnThing(c, s, 0.5, 0.5, 0.3) for c, s in things),
                          1.0, (1.0, 1.0, 1.0), 0.0, 0.0, 0)

    frames = [frame("baboon.jpg", ("green", "circle")), frame("baboon.jpg", ("blue", "square")),
              frame("orange.jpg", ("green", "square"), ("red", "triangle")), frame("orange.jpg")]
    probs = torch.zeros(len(frames), len(THING_NAMES))
    probs[0, THING_NAMES.index("red circle")] = 0.99      # the circle, in the wrong colour
    probs[1, THING_NAMES.index("blue square")] = 0.99     # named
    probs[2, THING_NAMES.index("red triangle")] = 0.99    # one of two named, the square not
    probs[3, THING_NAMES.index("red square")] = 0.99      # nothing drawn: a false word, not counted here
    got = score(probs, frames, 0.95)["named_by_source"]
    assert got == {"baboon.jpg": {"things": 2, "named": 1, "miscoloured": 1},
                   "orange.jpg": {"things": 2, "named": 1, "miscoloured": 0}}


def test_cell_targets_mark_the_cells_a_thing_covers_and_leave_its_border_unscored():
    from videokv_node.tinyvlm.drawn import DrawnFrame, DrawnThing
    from videokv_node.tinyvlm.train_things_head import cell_targets

    def frame(*things):
        return DrawnFrame("x.jpg", 0, (0.5, 0.5, 1.0), things, 1.0, (1.0, 1.0, 1.0), 0.0, 0.0, 0)

    # grid 7, a 4:3 frame; cell centres at (k + 0.5) / 7. A side of 0.2 at the centre: half 0.1 high, 0.075 wide,
    # so only cell (3, 3) has its centre inside; its box reaches the 8 cells around it (within half a cell, 0.0714)
    small = DrawnThing("red", "circle", 0.5, 0.5, 0.2)
    # a side of 0.6 at x 0.25: rows 1-5 (|centre - 0.5| <= 0.3), columns 0-2 (|centre - 0.25| <= 0.225); column 3
    # (0.25 from it, under 0.225 + 0.0714) overlapped, column 4 (0.39) not
    big = DrawnThing("blue", "square", 0.25, 0.5, 0.6)
    y, w = cell_targets([frame(small), frame(big), frame()], grid=7, aspect=4 / 3)
    red, blue = THING_NAMES.index("red circle"), THING_NAMES.index("blue square")
    assert y.shape == w.shape == (3, 49, len(THING_NAMES))
    assert y[0, :, red].nonzero().flatten().tolist() == [3 * 7 + 3]
    assert sorted((w[0, :, red] == 0).nonzero().flatten().tolist()) == sorted(
        r * 7 + c for r in (2, 3, 4) for c in (2, 3, 4) if (r, c) != (3, 3))
    assert sorted(y[1, :, blue].nonzero().flatten().tolist()) == [r * 7 + c for r in range(1, 6) for c in range(3)]
    assert sorted((w[1, :, blue] == 0).nonzero().flatten().tolist()) == [r * 7 + 3 for r in range(1, 6)]
    others = [k for k in range(len(THING_NAMES)) if k not in (red, blue)]
    assert y[:, :, others].sum() == 0 and bool((w[:, :, others] == 1).all())
    assert y[2].sum() == 0 and bool((w[2] == 1).all())  # nothing drawn: every cell a negative
