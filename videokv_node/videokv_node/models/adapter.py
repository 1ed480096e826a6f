"""The contract between the memory engine and a Video-LLM.

The engine only ever sees a decoder that turns embeddings at explicit positions
into KV entries in a transformers ``Cache``, a vision path that turns RGB frames
into a fixed number of embeddings per frame, and a tokenizer. Everything
model-specific (prompt format, rotary convention, where queries are computed)
lives behind this interface, so a memory policy runs unchanged on every model.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np
import torch
from transformers.cache_utils import Cache

from videokv_node.models.attention import AttentionObserver


@dataclass(frozen=True, slots=True)
class KVGeometry:
    """Shape of one token's KV entry across the decoder: what a memory block stores."""

    n_layers: int
    n_kv_heads: int
    head_dim: int
    n_q_heads: int
    dtype: torch.dtype

    @property
    def bytes_per_token(self) -> int:
        """Bytes of K and V for one token over all layers."""
        elem = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * elem


class VideoLLMAdapter(ABC):
    """A Video-LLM driven through the public transformers API.

    Invariants every adapter guarantees:
    - ``encode_frames`` returns exactly ``tokens_per_frame`` embeddings per frame;
    - ``forward`` appends one KV entry per input embedding to every layer of the
      cache, rotated at the given positions, and never mutates earlier entries;
    - ``rotate_keys`` moves cached keys exactly (see ``models/rope.py``).
    """

    name: str
    geometry: KVGeometry
    tokens_per_frame: int
    max_positions: int  # largest position + 1 the decoder was built for
    device: torch.device
    position_dims: int = 1  # rows of a position tensor: 1 for 1-D RoPE, 3 for mRoPE (t, h, w)

    # --- positions --------------------------------------------------------
    # Positions are (P, T) int64 tensors on the host, P = ``position_dims``.
    # Text tokens have equal rows. The defaults are 1-D RoPE; mRoPE adapters override.
    @property
    def frame_span(self) -> int:
        """How far one frame advances the next free position (``tokens_per_frame`` for 1-D RoPE)."""
        return self.tokens_per_frame

    def text_positions(self, start: int, n: int) -> torch.Tensor:
        """(P, n) positions of ``n`` text tokens from ``start``."""
        return torch.arange(start, start + n).expand(self.position_dims, n).clone()

    def frame_positions(self, start: int) -> torch.Tensor:
        """(P, tokens_per_frame) positions of one frame's tokens when the frame starts at ``start``."""
        return self.text_positions(start, self.tokens_per_frame)

    def pack(self, pieces: list[torch.Tensor], start: int) -> tuple[list[torch.Tensor], int]:
        """Lay ``pieces`` (each the (P, t) stored positions of some kept tokens, time order) out
        consecutively from ``start``; returns the new positions of each piece and the next free position.

        1-D RoPE: tokens get consecutive positions (StreamKV and HERMES' re-indexing treat kept
        tokens as adjacent). Every token moves by one scalar delta on all rows, which is what
        ``rotate_keys`` can apply exactly.
        """
        sizes = [piece.shape[1] for piece in pieces]
        total = sum(sizes)
        # One range split into views: a per-piece range cost a tensor per block per layer per step.
        return list(self.text_positions(start, total).split(sizes, dim=1)), start + total

    # --- vision -----------------------------------------------------------
    @abstractmethod
    def encode_frames(self, frames: list[np.ndarray]) -> torch.Tensor:
        """RGB uint8 frames (H, W, 3), any size -> (F, tokens_per_frame, hidden) embeddings."""

    def frame_words(self, feats: torch.Tensor) -> list[tuple[str, ...]]:
        """(F, tokens_per_frame, hidden) frames from ``encode_frames`` -> per frame the words its tokens
        spell out as text, if the model writes any into a frame (videokv-tiny v5's nouns), most certain
        first. The memory keeps them with the frame's block for ``~/locate`` (``memory/questions/locate.py``,
        ``words_shortlist``). Default: none (a model whose frame tokens are all visual)."""
        return [() for _ in range(feats.shape[0])]

    # --- text -------------------------------------------------------------
    @abstractmethod
    def prefix_ids(self) -> list[int]:
        """Tokens before the first frame (system prompt, user turn opening): the attention sink."""

    @abstractmethod
    def text_ids(self, text: str) -> list[int]:
        """Plain text -> token ids, no special tokens added (guidance prompts, pseudo queries)."""

    @abstractmethod
    def question_ids(self, question: str, options: list[str]) -> list[int]:
        """Tokens after the frames: the question, the options if any, and the assistant turn opening."""

    @abstractmethod
    def option_token_ids(self, n_options: int) -> list[int]:
        """The single token of each option letter ("A", "B", ...), scored for multiple choice."""

    @abstractmethod
    def embed_tokens(self, ids: list[int]) -> torch.Tensor:
        """Token ids -> (1, n, hidden) input embeddings on the model's device."""

    @abstractmethod
    def decode(self, ids: list[int]) -> str:
        """Generated ids -> text, special tokens removed."""

    @property
    @abstractmethod
    def eos_token_ids(self) -> set[int]:
        """Ids that end an answer."""

    # --- decoder ----------------------------------------------------------
    @abstractmethod
    def forward(
        self,
        embeds: torch.Tensor,
        positions: torch.Tensor,
        cache: Cache,
        logits: bool = True,
        observer: AttentionObserver | None = None,
        n_logits: int = 1,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor | None:
        """Run the decoder on (1, n, hidden) ``embeds`` at ``positions`` ((P, n) or (n,)), appending to ``cache``.

        Returns the last token's logits (vocab,) in float32, or None if ``logits`` is False; with
        ``n_logits`` > 1, the last ``n_logits`` tokens' logits (n_logits, vocab), in order (a
        continuation scored in one pass: ``~/locate``'s likelihood re-ranking).
        (B, n, hidden) ``embeds`` with B > 1 run B rows at the same positions over a cache of batch B
        (frames of one size re-read at once, ``memory/questions/locate.py``; no observer) and keep the leading B.
        ``observer`` sees every layer's post-RoPE queries and keys (``models/attention.py``).
        ``mask``: (1, 1, n, K) boolean, which keys each new token sees in every layer (K: the
        cache's length plus n); default causal after the whole cache (``models/attention.py``).
        """

    @abstractmethod
    def rotate_keys(self, keys: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        """Re-rotate cached keys (..., T, head_dim) by ``delta``: (T,) the same on every position row,
        or (P, T) per row (mRoPE). Exact: equal to the key computed at the moved position."""

    @abstractmethod
    def query_modules(self) -> list[torch.nn.Module]:
        """Per decoder layer, the module whose output is that layer's pre-RoPE query (B, n, H_q * D).

        Forward hooks on these give a question's queries without touching attention code.
        """

    @abstractmethod
    def fingerprint(self) -> str:
        """A stable identifier of the weights and config, so stored memory is never used with another model."""
