"""The interface every memory policy implements (the factory that picks one: ``factory.py``).

A policy decides, never stores: what gets encoded when a frame arrives (one
block per frame, a whole segment plus its summary, three granularities), what
the new tokens attend to while encoded, what is compressed right after, whether a
block leaving the device is offloaded (the oldest leaves first: ``frames/caps.py``), where kept
tokens stand for RoPE, and what a question attends to in each layer (``select``,
the one way in; its result is typed by mode: ``selection.py``). The engine and
the block store do the moving and the counting, so a policy is a small class
(see ``policies/``). What a policy may ask of the engine is
``PolicyHost`` (``host.py``): a policy never sees the engine itself.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Sequence
from typing import ClassVar, Protocol, final

import torch

from videokv_node.memory.config import MemoryConfig
from videokv_node.memory.context.encoding import EncodeJob, Unit  # re-exported for the policies
from videokv_node.memory.context.retrieval_cache import Targets, pack_layout
from videokv_node.memory.policies.host import PolicyHost, Probe  # Probe: re-exported for the policies
from videokv_node.memory.context.selection import Selection
from videokv_node.memory.store.block import FrameBlock, Tier, newest_within, present_in, recent_within  # re-exported for the policies
from videokv_node.memory.store.block_index import Candidates
from videokv_node.memory.store.block_store import BlockStore
from videokv_node.models.adapter import VideoLLMAdapter
from videokv_node.models.attention import AttentionObserver

__all__ = [
    "EncodeJob", "MemoryPolicy", "OpenSegment", "PolicyHost", "Probe", "Unit", "present_in", "recent_resident",
    "recent_within",
]


class OpenSegment(Protocol):
    """Frames a policy holds outside the store until it makes blocks of them (StreamKV's open segment).

    The engine reads it for a question (the units, and the blocks to attend to), for the caps (the entries
    counted in the resident budget) and for the stats (the bytes)."""

    def units(self) -> list[Unit]:
        """The frames received and not yet in blocks, as units (time order)."""

    def blocks(self, host: PolicyHost) -> list[FrameBlock]:
        """Their blocks for a question to attend to, outside the store (kept up to date by the policy)."""

    def entries(self) -> int:
        """Resident (token, layer) entries held for them outside the store: counted in the resident budget."""

    def feature_bytes(self) -> int:
        """Bytes of frame features waiting outside the KV figures."""


class MemoryPolicy(ABC):
    """Base policy: one block per frame, oldest-first demotion and eviction, packed positions."""

    name: ClassVar[str]
    uses_offload: ClassVar[bool]  # False: a block leaving the device is evicted, not offloaded
    # True: frames are encoded after the whole resident tier and questions read it as it is, so the
    # engine keeps it placed between steps (memory/context/resident_cache.py) instead of rebuilding it.
    resident_context: ClassVar[bool] = False

    def __init__(self, config: MemoryConfig, adapter: VideoLLMAdapter) -> None:
        self.config = config
        self.adapter = adapter
        self.n_layers = adapter.geometry.n_layers

    def setup(self, host: PolicyHost) -> None:
        """Called once the sink is encoded; policies with guidance prompts compute them here (``host.probe``).
        A policy that needs the engine later keeps ``host`` (the narrow interface), never the engine."""

    def reset(self) -> None:
        """Forget per-stream state (open segments, counters) on a memory reset."""

    # --- run-time configuration (engine.reconfigure) --------------------------
    def check_budget(self, budget_tokens: int, sink_tokens: int) -> None:
        """Raise ConfigError if ``budget_tokens`` cannot work for this policy; none of its own by default."""

    def reconfigure(self, config: MemoryConfig, store: BlockStore) -> None:
        """Adopt ``config`` (same policy and hyper-parameters, another budget or retrieval count,
        already checked) and apply any cap of the policy's own now; the engine's caps follow."""
        self.config = config

    # --- state (the engine's state_dict; memory/snapshot/format.py writes it) -------------
    def state_dict(self) -> dict:
        """The per-stream state a restart must get back: ``{"meta": JSON-able dict, "tensors": named tensors}``.

        Only what ``reset`` would forget (open segments, ages, counters): what ``__init__``
        and ``setup`` derive from the config and the model is rebuilt, never saved. Tensor
        names are the policy's own (a snapshot prefixes them with ``policy/``). Default: none.
        """
        return {"meta": {}, "tensors": {}}

    def load_state_dict(self, state: dict, blocks: dict[int, dict]) -> None:
        """Replace the per-stream state by one ``state_dict`` gave. ``blocks``: the state dicts of
        the blocks restored with it (``FrameBlock.state_dict``), by id; the store does not hold
        them yet, ``after_restore`` comes once it does.

        Validates everything before changing anything: on a state that does not fit it raises
        (``ValueError``, ``KeyError``, ...) and the policy is unchanged. Default: nothing to restore.
        """

    def without_blocks(self, state: dict, lost: Collection[int]) -> dict:
        """``state`` (one ``state_dict`` gave) less every reference to the blocks ``lost``: a snapshot
        could not restore them (a damaged segment), and ``load_state_dict`` must then take the state
        with the others alone. Returns a new state, the given one unchanged. Default: ``state`` (the
        policy keeps no block ids)."""
        return state

    def after_restore(self, store: BlockStore) -> None:
        """Called once restored blocks are in the store, before the engine's caps are enforced:
        a policy with caps of its own (HERMES' per-layer budget) applies them here. Default: nothing."""

    # --- encoding -----------------------------------------------------------
    def on_frame(self, store: BlockStore, unit: Unit) -> list[EncodeJob]:
        """What to encode now that ``unit`` (one frame) arrived: by default that frame, alone."""
        return [EncodeJob([unit])]

    @abstractmethod
    def encoding_context(self, store: BlockStore, job: EncodeJob) -> list[FrameBlock]:
        """Resident blocks, in time order, that the job's tokens attend to (besides the prompt sink)."""

    def encode_observer(self, job: EncodeJob) -> AttentionObserver | None:
        """An observer of the job's forward pass (for attention-based compression); none by default."""
        return None

    def after_encode(self, store: BlockStore, job: EncodeJob, blocks: list[FrameBlock]) -> None:
        """Compress right after a job is encoded (its blocks are in the store); nothing by default."""

    def batch_window(self) -> int | None:
        """Tokens of the window a frame is encoded after, if frames may be prefilled several in one pass
        (``memory/context/batch_prefill.py``); None (default): one pass per frame.

        A policy returning W guarantees: ``on_frame`` makes one job of the frame alone, with no
        observer and no ``after_encode`` change to its tokens; ``encoding_context`` is the newest
        resident blocks (creation order) within W tokens; the caps never demote or evict a block
        of the next frame's window. The engine checks the window frame by frame and raises if not.
        """
        return None

    def after_frame(self, host: PolicyHost) -> None:
        """Called once a frame's jobs are encoded and stored, before the caps are enforced; nothing by default."""

    def open_segment(self) -> OpenSegment | None:
        """Frames the policy holds outside the store (StreamKV's open segment), or None (default: none)."""
        return None

    @final
    def pending_units(self) -> list[Unit]:
        """Frames received but not yet encoded into blocks (``open_segment``'s units; not a hook)."""
        segment = self.open_segment()
        return segment.units() if segment is not None else []

    def resident_tokens(self, budget_tokens: int, sink_tokens: int) -> int:
        """Tokens per layer the engine lets the store hold on the device: ``budget_tokens`` less the sink
        (HERMES' ``script`` budget rule: its budget plus one chunk)."""
        return budget_tokens - sink_tokens

    def layout(self, sink_len: int, per_layer: Sequence[Sequence[FrameBlock]]) -> tuple[Targets, int]:
        """Where each layer's kept tokens stand for RoPE, and the next free position."""
        return pack_layout(self.adapter, sink_len, per_layer)

    # --- questions ----------------------------------------------------------
    @abstractmethod
    def select(self, host: PolicyHost, candidates: Candidates, question: str) -> Selection:
        """What ``question`` attends to among ``candidates`` (a mask over the index, already filtered by
        camera and time window; ``candidates.blocks()`` lists them in time order, O(candidates) in Python:
        policies that score every block held read the index under the mask instead, issue 16).

        The one way a question's context is chosen: ``Static`` (each layer's blocks, decided now) or
        ``InPass`` (ReKV's retrieval inside the pass), ``context/selection.py``. Whatever the policy
        needs first (the question's probe, a re-reading of a shortlist) it asks of ``host`` here; the
        engine only builds the cache the result names. Reads memory, never changes it."""

    def locate_scores(self, host: PolicyHost, candidates: list[FrameBlock], text: str) -> torch.Tensor | None:
        """(N,) this policy's own retrieval score of each candidate for ``text`` (``~/locate``), asking ``host``
        what it needs (the text's probe, the store's index), or None when it has none: locate then ranks frames
        by a question prefill's attention mass (``memory/questions/locate.py``). Default: None."""
        return None


def recent_resident(store: BlockStore, max_tokens: int, stream: str | None = None) -> list[FrameBlock]:
    """``recent_within`` of the resident blocks (of ``stream`` only, if given), in time order, reading
    the resident tier newest first only as far as the window goes."""
    resident = store.newest_first(Tier.RESIDENT)
    return newest_within(resident if stream is None else (b for b in resident if b.stream == stream), max_tokens)
