"""videokv-tiny v5's noun table and noun block (models/nouns.py): the committed table's shape and hand-written
rows, and the block's arithmetic against references computed independently (numpy, token by token)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from videokv_node.models.nouns import NOUNS_FILE, N_CLASSES, NounBlock, NounConfig, article, read_noun_table
from videokv_node.models.tiny_tokenizer import build_tiny_tokenizer
from videokv_node.models.videokv_tiny import WEIGHTS_DIR, VideoKVTinyAdapter

TABLE = read_noun_table(WEIGHTS_DIR / NOUNS_FILE)

# Written by hand from the ImageNet class names, not from the table.
HAND_ROWS = {
    0: "fish", 7: "chicken", 151: "dog", 207: "dog", 254: "dog", 268: "dog", 269: "wolf", 281: "cat", 285: "cat",
    291: "lion", 330: "rabbit", 339: "horse", 385: "elephant", 423: "chair", 436: "car", 444: "bicycle",
    468: "car", 487: "phone", 504: "mug", 511: "car", 532: "table", 559: "chair", 609: "car", 620: "laptop",
    656: "car", 671: "bicycle", 673: "mouse", 751: "car", 760: "fridge", 765: "chair", 779: "bus", 817: "car",
    831: "sofa", 846: "lamp", 850: "teddy bear", 851: "television", 879: "umbrella", 920: "traffic light",
    948: "apple", 950: "orange", 954: "banana", 963: "pizza", 968: "cup",
    406: "", 408: "", 984: "",  # an altar, an amphibious vehicle, rapeseed: no noun a robot user asks for
}


def test_table_has_one_row_per_class_in_order_and_a_few_hundred_nouns():
    lines = (WEIGHTS_DIR / NOUNS_FILE).read_text().splitlines()
    assert lines[0] == "index\tclass\tnoun" and len(lines) == 1 + N_CLASSES
    assert [int(line.split("\t")[0]) for line in lines[1:]] == list(range(N_CLASSES))
    assert len(TABLE) == N_CLASSES
    distinct = set(TABLE) - {""}
    assert 300 <= len(distinct) <= 700
    assert 10 <= TABLE.count("") <= 100
    assert all(n == n.strip() and "\t" not in n for n in TABLE)


def test_table_classes_are_imagenet_in_order():
    names = [line.split("\t")[1] for line in (WEIGHTS_DIR / NOUNS_FILE).read_text().splitlines()[1:]]
    assert names[0] == "tench" and names[504] == "coffee mug" and names[817] == "sports car" and names[999] == "toilet tissue"


@pytest.mark.parametrize("index, noun", sorted(HAND_ROWS.items()))
def test_hand_written_rows(index, noun):
    assert TABLE[index] == noun


def test_every_dog_breed_is_a_dog_and_every_cat_breed_a_cat():
    assert set(TABLE[151:269]) == {"dog"}
    assert set(TABLE[281:286]) == {"cat"}


def test_article():
    assert article("mug") == "a mug" and article("orange") == "an orange" and article("umbrella") == "an umbrella"


def _block(class_nouns, threshold=0.2, slots=2, slot_tokens=3):
    tok = build_tiny_tokenizer()
    torch.manual_seed(0)
    embed = torch.nn.Embedding(len(tok), 8)
    return NounBlock(class_nouns, tok, embed, NounConfig(slots=slots, slot_tokens=slot_tokens, threshold=threshold)), tok, embed


def test_noun_probs_sum_the_softmax_per_noun():
    block, _, _ = _block(["dog", "cat", "dog", "", "cup"])
    logits = torch.tensor([[1.0, 2.0, 0.5, 3.0, -1.0]])
    p = np.exp(logits.numpy()[0]) / np.exp(logits.numpy()[0]).sum()
    want = {"": p[3], "cat": p[1], "cup": p[4], "dog": p[0] + p[2]}
    got = block.noun_probs(logits)[0]
    assert block.nouns == ["", "cat", "cup", "dog"]
    for i, noun in enumerate(block.nouns):
        assert got[i].item() == pytest.approx(want[noun], abs=1e-6)


def test_top_nouns_most_probable_first_below_threshold_padded():
    block, _, _ = _block(["dog", "cat", "dog", "", "cup"], threshold=0.2)
    # probabilities: dog 0.3 + 0.1 = 0.4, cat 0.15, '' 0.4 (never written), cup 0.05
    logits = torch.tensor([[0.3, 0.15, 0.1, 0.4, 0.05]]).log()
    index, probs = block.top(logits)
    assert block.names(index) == [["dog"]]  # cat's 0.15 is under the threshold
    assert index.tolist() == [[3, 0]] and probs[0, 0].item() == pytest.approx(0.4, abs=1e-6)
    logits = torch.tensor([[0.15, 0.4, 0.15, 0.25, 0.05]]).log()  # cat 0.4, dog 0.3
    assert block.names(block.top(logits)[0]) == [["cat", "dog"]]


def test_slots_are_the_decoders_own_embeddings_of_the_noun_then_pad():
    block, tok, embed = _block(["dog", "cat", "", "cup"], slot_tokens=4)
    pad = tok.encode(",", add_special_tokens=False)[0]
    index = torch.tensor([[3, 0]])  # dog, then an empty slot
    got = block.embed_slots(index)[0]  # (2 * 4, hidden)
    dog = tok.encode(" dog", add_special_tokens=False)[:4]
    want_ids = dog + [pad] * (4 - len(dog)) + [pad] * 4
    assert torch.equal(got, embed.weight[torch.tensor(want_ids)])
    assert block.tokens == 8


def test_tiny_adapter_with_nouns_writes_the_block_after_the_visual_tokens():
    adapter = VideoKVTinyAdapter.tiny(nouns=True)
    plain = VideoKVTinyAdapter.tiny(nouns=False)
    assert adapter.tokens_per_frame == 6 + adapter.nouns.tokens == 12 and plain.tokens_per_frame == 6
    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 256, (48, 64, 3), dtype=np.uint8) for _ in range(3)]
    feats = adapter.encode_frames(frames)  # (3, 12, hidden)
    assert feats.shape == (3, 12, adapter.model.config.hidden_size)
    assert torch.equal(feats[:, :6], plain.encode_frames(frames))  # same seed: the same visual tokens
    with torch.inference_mode():
        index, _ = adapter.nouns.top(adapter.encoder(adapter.preprocess(frames)))
    assert torch.equal(feats[:, 6:], adapter.nouns.slot_embeds[index].flatten(1, 2).to(feats.dtype))
    assert [[n for n, _ in f] for f in adapter.frame_nouns(frames)] == adapter.nouns.names(index)
    assert adapter.fingerprint() != plain.fingerprint()


def test_read_gives_back_the_nouns_written_in_any_precision_and_none_for_a_mix():
    """``NounBlock.read``: the block ``embed_slots`` wrote for (dog, cup), (cat, none) and (none, none) reads back
    as those nouns in order, also rounded to bfloat16; the mean of two different blocks (a policy averaging
    frames) names no noun in the slots where they differ."""
    block, _, _ = _block(["dog", "cat", "", "cup"])
    index = torch.tensor([[3, 2], [1, 0], [0, 0]])  # nouns: '' cat cup dog
    written = block.embed_slots(index)
    assert block.read(written) == [("dog", "cup"), ("cat",), ()]
    assert block.read(written.to(torch.bfloat16)) == [("dog", "cup"), ("cat",), ()]
    mixed = (block.embed_slots(torch.tensor([[3, 1]])) + block.embed_slots(torch.tensor([[2, 1]]))) / 2
    assert block.read(mixed) == [("cat",)]  # slot 1 differs (dog vs cup): none; slot 2 is cat in both


def test_tiny_adapter_frame_words_are_the_nouns_it_wrote():
    adapter = VideoKVTinyAdapter.tiny(nouns=True)
    rng = np.random.default_rng(1)
    frames = [rng.integers(0, 256, (48, 64, 3), dtype=np.uint8) for _ in range(4)]
    feats = adapter.encode_frames(frames)
    # The tests' tiny tokenizer cuts nouns to a slot's 3 tokens, so some share a slot ("dock", "dog"): compared
    # by what the decoder reads, their slots' token ids (never cut with SmolLM2's: test_videokv_tiny_weights.py).
    ids = {n: adapter.nouns.slot_ids[i].tolist() for i, n in enumerate(adapter.nouns.nouns)}
    read = [[ids[n] for n in f] for f in adapter.frame_words(feats)]
    assert read == [[ids[n] for n, _ in f] for f in adapter.frame_nouns(frames)] and any(read)
    plain = VideoKVTinyAdapter.tiny(nouns=False)
    assert plain.frame_words(plain.encode_frames(frames)) == [()] * 4  # no noun block: no words
