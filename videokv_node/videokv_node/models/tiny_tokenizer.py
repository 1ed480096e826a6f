"""A byte-level tokenizer built in code, for the random-weight ``tiny`` model.

The tiny model must run with no files at all (CI has no model hub), yet go
through the same tokenizer API as a real checkpoint. A byte-level BPE with no
merges is exactly that: every UTF-8 byte is one token, so any text round-trips,
and the chat-format special tokens of Qwen2 are added on top. A model that needs
more special tokens (Qwen-VL's vision markers) appends them after these, so the
ids of the shared ones, and the vocabulary of models that do not ask, never change.
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<image>", "<video>"]
# Qwen2-VL / Qwen2.5-VL vision markers and placeholders, as in their tokenizer.
QWEN_VL_SPECIAL_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]


def build_tiny_tokenizer(extra_special_tokens: Sequence[str] = ()) -> PreTrainedTokenizerFast:
    """256 byte tokens (ids 0..255), the special tokens (ids 256..260), then ``extra_special_tokens``
    (ids 261, ...) in the given order."""
    specials = SPECIAL_TOKENS[1:] + [t for t in extra_special_tokens if t not in SPECIAL_TOKENS]
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    byte_to_char = _bytes_to_unicode()
    vocab = {byte_to_char[b]: b for b in range(256)}
    assert set(vocab) == set(alphabet)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=specials,
    )
    tokenizer.add_special_tokens({"additional_special_tokens": specials})
    return tokenizer


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map, which ByteLevel uses."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}
