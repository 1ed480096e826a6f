"""train_v6's word noise: which block a showing of a frame gets, counted against rates worked out by hand."""

from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from videokv_node.tinyvlm.word_noise import WordNoise, WordNoiser

# a block's index -> word: 0 no noun, 1-3 the classifier's nouns, 4-9 the head's words (2 colours x 3 shapes)
EXTRA = ("red circle", "red square", "red triangle", "blue circle", "blue square", "blue triangle")
NOUNS = ["", "dog", "orange", "squirrel", *EXTRA]
RED_SQUARE, BLUE_SQUARE = 5, 8
WITH_HEAD = torch.tensor([RED_SQUARE, 2])  # "red square", then the classifier's "orange"
BARE = torch.tensor([2, 3])  # what the classifier alone writes on that frame
EMPTY = torch.tensor([1, 0])  # a frame with no head word: "dog", then a pad slot


def draws(noise, index, bare, n=6000, seed=0):
    noiser, gen = WordNoiser(noise, NOUNS, EXTRA), torch.Generator().manual_seed(seed)
    return Counter(tuple(noiser(index, bare, gen).tolist()) for _ in range(n))


def test_no_noise_changes_nothing():
    assert draws(WordNoise(), WITH_HEAD, BARE, 200) == Counter({(RED_SQUARE, 2): 200})
    assert draws(WordNoise(), EMPTY, EMPTY, 200) == Counter({(1, 0): 200})
    assert not WordNoise() and WordNoise(false=0.1)


def test_drop_and_swap_rates_on_a_named_frame():
    n = 8000
    got = draws(WordNoise(drop=0.2, swap=0.1, false=0.5), WITH_HEAD, BARE, n)
    # by hand: the bare block 20%; the other colour of the same shape ("blue square", the only partner) 10%;
    # the rest unchanged; ``false`` never touches a frame that has a head word
    assert set(got) == {(2, 3), (BLUE_SQUARE, 2), (RED_SQUARE, 2)}
    assert got[(2, 3)] / n == pytest.approx(0.2, abs=0.015)
    assert got[(BLUE_SQUARE, 2)] / n == pytest.approx(0.1, abs=0.012)


def test_false_words_go_first_and_are_uniform_over_the_heads_words():
    n = 12000
    got = draws(WordNoise(drop=0.9, false=0.3), EMPTY, EMPTY, n)
    assert got[(1, 0)] / n == pytest.approx(0.7, abs=0.015)  # drop never touches a frame without a head word
    false = {k: v for k, v in got.items() if k != (1, 0)}
    assert set(false) == {(w, 1) for w in range(4, 10)}  # the word first, "dog" second, the pad fell out
    for v in false.values():
        assert v / n == pytest.approx(0.3 / 6, abs=0.01)


def test_seeded():
    noise = WordNoise(drop=0.3, swap=0.3, false=0.3)
    assert draws(noise, WITH_HEAD, BARE, 50, 4) == draws(noise, WITH_HEAD, BARE, 50, 4)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 9), min_size=2, max_size=2), st.floats(0, 0.5), st.floats(0, 0.5), st.floats(0, 1),
       st.integers(0, 10**6))
def test_a_swap_keeps_the_shape_and_changes_the_colour(index, drop, swap, false, seed):
    index = torch.tensor(index)
    out = WordNoiser(WordNoise(drop, swap, false), NOUNS, EXTRA)(index, BARE, torch.Generator().manual_seed(seed))
    assert out.shape == index.shape
    if torch.equal(out, BARE) or torch.equal(out, index):
        return
    if (index >= 4).any():  # swapped: each head word now another colour of its shape; the classifier's kept
        for a, b in zip(index.tolist(), out.tolist()):
            if a >= 4:
                assert NOUNS[a].split()[1] == NOUNS[b].split()[1] and NOUNS[a] != NOUNS[b]
            else:
                assert a == b
    else:  # a false word put first
        assert out[0] >= 4 and out[1] == index[0]


@pytest.mark.parametrize("text", ["drop", "drops=0.1", "drop=0.7,swap=0.4", "false=2"])
def test_bad_rates_are_refused(text):
    with pytest.raises(ValueError, match="word noise"):
        WordNoise.parse(text)


def test_parse():
    assert WordNoise.parse("drop=0.2, false=0.03") == WordNoise(drop=0.2, false=0.03)
    assert WordNoise.parse("") == WordNoise()
    with pytest.raises(ValueError, match="head's words"):
        WordNoiser(WordNoise(drop=0.1), NOUNS[:-1], EXTRA)


def test_the_trainer_gives_each_showing_its_noisy_block_and_draws_nothing_without_noise():
    from transformers import LlamaForCausalLM

    from videokv_node.models.tiny_tokenizer import build_tiny_tokenizer
    from videokv_node.models.videokv_tiny import Projector, tiny_llama_config
    from videokv_node.tinyvlm.trainer import ProjectorTrainer

    tokenizer = build_tiny_tokenizer()
    torch.manual_seed(0)
    llm = LlamaForCausalLM(tiny_llama_config(tokenizer)).eval()
    projector = Projector(llm.config.hidden_size, mlp_dim=8)
    blocks, bare = {"a": WITH_HEAD, "b": EMPTY}, {"a": BARE, "b": EMPTY}
    plain = ProjectorTrainer(llm, tokenizer, projector, {}, blocks=blocks)
    state = plain._gen.get_state()
    assert torch.equal(plain._block("a"), WITH_HEAD) and torch.equal(plain._gen.get_state(), state)
    dropped = ProjectorTrainer(llm, tokenizer, projector, {}, blocks=blocks, bare_blocks=bare,
                               word_noise=WordNoiser(WordNoise(drop=1.0), NOUNS, EXTRA))
    assert torch.equal(dropped._block("a"), BARE) and torch.equal(dropped._block("b"), EMPTY)
    with pytest.raises(ValueError, match="with and without"):
        ProjectorTrainer(llm, tokenizer, projector, {}, blocks=blocks, word_noise=WordNoiser(WordNoise(drop=1.0), NOUNS, EXTRA))
