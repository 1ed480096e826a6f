"""A fake engine's two ingest stages, as ``VideoMemoryEngine`` has them (``memory/frames/vision_stage.py``):
``prepare`` keeps every frame and runs no vision, ``ingest_prepared`` hands them to the fake's ``ingest``."""

from videokv_node.memory.frames.vision_stage import PreparedFrames, run_now


class StagedIngest:
    def prepare(self, frames, vision=None):
        return PreparedFrames(list(frames), (vision or run_now)(lambda: (None, 0.0)))

    def ingest_prepared(self, prepared, between=None):
        prepared.vision.result()
        return self.ingest(prepared.frames, between)
