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
