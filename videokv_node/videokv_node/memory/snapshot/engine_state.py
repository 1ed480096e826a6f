"""The engine's state out and in, the ``state_dict`` way: what a restart must get back.

``EngineState`` is the engine's collaborator for it. The engine's state is its
counters, the poses and words of frames no block cites yet, the block store's state (``BlockStore.state_dict``: every block and its
K/V) and the policy's (``MemoryPolicy.state_dict``). What the engine derives from the
config and the model (the prompt sink, the policy's guidance) is rebuilt, never saved;
``identity`` says what a saved state must match. ``memory/snapshot/format.py`` writes a state to
disk and reads it back; nothing here knows about files.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection

from videokv_node.memory.context.model_runner import ModelRunner
from videokv_node.memory.frames.caps import offload_victim
from videokv_node.memory.frames.ingest_pipeline import IngestPipeline
from videokv_node.memory.policies.base import MemoryPolicy
from videokv_node.memory.questions.question_reader import QuestionReader
from videokv_node.memory.records.state import PolicyStateError, dtype_name, reason
from videokv_node.memory.store.block import FrameBlock
from videokv_node.memory.store.block_store import BlockStore
from videokv_node.memory.store.frame_tables import FrameTables


class EngineState:
    """``identity``, ``state_dict`` and ``load_state_dict`` of an engine's memory (the engine's thread).

    It reads and replaces the store, the policy's state, the runner's block ids, the pipeline's counters and the
    frame tables (``store/frame_tables.py``); after a load it clears the reader's record of the last question and
    calls ``refresh_stats``. Derived things (the sink, the policy's guidance) are never saved."""

    def __init__(self, runner: ModelRunner, store: BlockStore, policy: MemoryPolicy, tables: FrameTables,
                 pipeline: IngestPipeline, reader: QuestionReader, refresh_stats: Callable[[], None]) -> None:
        self.runner, self.adapter, self.store, self.policy = runner, runner.adapter, store, policy
        self.tables, self.pipeline, self.reader, self.refresh_stats = tables, pipeline, reader, refresh_stats

    def identity(self) -> dict:
        """What a saved state must match to be loaded here: the model (name, fingerprint, tokens per
        frame, position dims, KV geometry, the prompt sink's token ids) and the policy's name."""
        adapter, geo = self.adapter, self.adapter.geometry
        model = {
            "name": adapter.name,
            "fingerprint": adapter.fingerprint(),
            "tokens_per_frame": adapter.tokens_per_frame,
            "position_dims": adapter.position_dims,
            "geometry": {
                "n_layers": geo.n_layers,
                "n_kv_heads": geo.n_kv_heads,
                "head_dim": geo.head_dim,
                "n_q_heads": geo.n_q_heads,
                "dtype": dtype_name(geo.dtype),
            },
            "sink_ids": list(adapter.prefix_ids()),
        }
        return {"model": model, "policy": self.policy.name}

    def state_dict(self, kv_for: Callable[[list[dict]], Collection[int]] | None = None) -> dict:
        """The whole memory, tensors by reference: copy them before the engine goes on.

        ``{"next_block_id", "frames_ingested", "pending_poses": {(camera, stamp): Pose}, "pending_words":
        {(camera, stamp): words},
        "store": BlockStore.state_dict(kv_for), "policy": MemoryPolicy.state_dict(), "config":
        the memory config as a dict (for people; ``load_state_dict`` ignores it)}``.
        """
        return {
            "next_block_id": self.runner.next_block_id,
            "frames_ingested": self.pipeline.ingested,
            "pending_poses": self.tables.pending_poses(self.store),
            "pending_words": self.tables.pending_words(self.store),
            "store": self.store.state_dict(kv_for),
            "policy": self.policy.state_dict(),
            "config": dataclasses.asdict(self.pipeline.settings.memory),
        }

    def load_state_dict(self, state: dict) -> None:
        """Replace every block, the counters, the poses and the policy's state by ``state``'s.

        ``state["lost"]["blocks"]`` (optional): ids of blocks the state once held but could not
        give back (a snapshot's damaged segment). The policy's state is taken without them
        (``MemoryPolicy.without_blocks``), so nothing restored refers to a block that is not
        there; their frames are simply not in memory, as if evicted (not counted as evictions).

        Checked before anything changes: every block is built (``FrameBlock.from_state_dict``),
        the ids and counters must agree, and the policy validates its state (one that does not
        fit raises ``PolicyStateError``); a malformed state raises ValueError, KeyError,
        TypeError, IndexError or AttributeError. On any of these nothing changed. Then the
        memory is swapped and the current caps enforced as after an ingest: the policy's own
        (``after_restore``), then the resident budget and the host arena, the policy choosing
        the victims and every eviction counted. The pose table is rebuilt from the blocks' poses
        and ``pending_poses``, the words table from ``pending_words``. Nothing there is expected to fail; should it (a bug, host memory
        exhausted), the memory is left empty rather than half restored.
        """
        store_state = state["store"]
        blocks = [FrameBlock.from_state_dict(s, self.store.device) for s in store_state["blocks"]]
        next_block_id, frames_ingested = int(state["next_block_id"]), int(state["frames_ingested"])
        pending_poses = dict(state["pending_poses"])
        pending_words = dict(state.get("pending_words", {}))  # none in a state from before 2026-11-27
        by_id = {b.block_id: s for b, s in zip(blocks, store_state["blocks"])}
        if by_id and next_block_id <= max(by_id):
            raise ValueError(f"next block id {next_block_id} is not after the last block {max(by_id)}")
        device = self.adapter.device
        policy_state = {"meta": state["policy"]["meta"], "tensors": {n: t.to(device) for n, t in state["policy"]["tensors"].items()}}
        lost = set(state.get("lost", {}).get("blocks", ()))
        if lost & set(by_id):
            raise ValueError(f"blocks {sorted(lost & set(by_id))} are both restored and lost")
        if lost:
            policy_state = self.policy.without_blocks(policy_state, lost)
        try:
            self.policy.load_state_dict(policy_state, by_id)
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
            raise PolicyStateError(f"the {self.policy.name} policy's state does not fit: {reason(exc)}") from exc
        try:
            with self.pipeline.lock:
                self.store.load_state_dict({**store_state, "blocks": blocks}, offload_victim)
                self.runner.next_block_id, self.pipeline.ingested = next_block_id, frames_ingested
                self.policy.after_restore(self.store)
                self.pipeline.enforce_caps_locked()
            self.tables.restore(blocks, pending_poses, pending_words)
            self.pipeline.prune_tables()
        except BaseException:
            with self.pipeline.lock:
                self.store.clear()
                self.policy.reset()
            self.tables.clear()
            raise
        finally:
            self.runner.resident_restart()
            self.pipeline.ingest_ms.clear()
            self.reader.clear_last()
            self.refresh_stats()
