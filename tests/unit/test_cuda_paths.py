"""Every policy on a CUDA device answers as it does on the CPU (runs where a GPU is lent).

The memory keeps its bookkeeping (block ids, stamps, host arena pages, retrieval indices) on
the CPU while the model, its KV and its attention live on the model's device. The first
GPU run found two bugs that no CPU test can show: an index on one device used on a tensor of
the other (TGV-KV's text-prioritised keep) and an asynchronous device-to-host copy read before
it landed (the host arena). This test feeds one needle stream to the tiny random text model on
both devices, under every policy and both presets at a 10% budget, and checks that the answers,
the frames each answer cites and the frames each layer attended are the same, and the option
scores agree to float32 rounding; and that ``locate`` ranks the same moments (ReKV's ranking put
host-held mean keys beside the probe's device queries). Skipped, with the reason, where torch sees no CUDA device.
"""

from __future__ import annotations

import pytest
import torch

from bench.accuracy import POLICIES, memory_config, stream_frames
from bench.long_stream import with_preset
from videokv_node.eval.needles import make_streams
from videokv_node.memory import GenerationConfig, Question, VideoMemoryEngine
from videokv_node.memory.questions.locate import LocateQuery
from videokv_node.models.text_lm import TextLMAdapter

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none visible to torch)")

N_FRAMES = 40
BUDGET = 0.10


def answers(adapter, stream, policy: str, preset: str) -> list[tuple]:
    n, T, sink = N_FRAMES, adapter.tokens_per_frame, len(adapter.prefix_ids())
    k = round(BUDGET * n)
    engine = VideoMemoryEngine(adapter, with_preset(memory_config(policy, BUDGET, k, n, T, sink), preset), GenerationConfig())
    for frame in stream_frames(stream):
        engine.ingest([frame])
    out = []
    for q in stream.questions:
        a = engine.ask(Question(q.question, options=list(q.choices)), option_scoring="likelihood")
        out.append((a.option_index, [e.stamp_ns for e in a.evidence], engine.last_layer_stamps, a.option_scores))
    # ~/locate too: ReKV ranks by its own mean keys (held on the host) against the probe's queries.
    found = engine.locate(LocateQuery(stream.questions[0].question, top_k=3))
    out.append((found.method, [m.stamp_ns for m in found.moments], None, [m.score for m in found.moments]))
    engine.close()
    return out


@pytest.fixture(scope="module")
def adapters():
    return TextLMAdapter.tiny(device="cpu"), TextLMAdapter.tiny(device="cuda")


@pytest.mark.parametrize("preset", ["robot", "paper"])
@pytest.mark.parametrize("policy", POLICIES)
def test_policy_answers_the_same_on_cuda_as_on_the_cpu(adapters, policy, preset):
    stream = make_streams(1, N_FRAMES, seed=3)[0]
    on_cpu, on_cuda = (answers(a, stream, policy, preset) for a in adapters)
    for i, (c, g) in enumerate(zip(on_cpu, on_cuda, strict=True)):
        assert g[0] == c[0], f"question {i}: option {g[0]} on cuda, {c[0]} on the cpu"
        assert g[1] == c[1], f"question {i}: cited stamps differ"
        assert g[2] == c[2], f"question {i}: per-layer attended stamps differ"
        torch.testing.assert_close(torch.tensor(g[3]), torch.tensor(c[3]), rtol=1e-4, atol=1e-5)


def _worded_answers(device: str, selection: str) -> list:
    """videokv-tiny's architecture (random weights) with frames' words as test_frame_words.py gives them: the
    blocks' words, a question's per-layer frames and ~/locate's moments."""
    import dataclasses

    from tests.unit.helpers import scene
    from tests.unit.test_frame_words import words_for
    from videokv_node.memory import MemoryConfig
    from videokv_node.memory.config import ReKVConfig
    from videokv_node.models.videokv_tiny import VideoKVTinyAdapter

    a = VideoKVTinyAdapter.tiny(device=device, nouns=True)
    frames = scene(11, 5, 3)
    feats = torch.cat([a.encode_frames([f.rgb]) for f in frames]).flatten(1).double()
    a.frame_words = lambda got: [words_for(int(i)) for i in torch.cdist(got.flatten(1).double(), feats).argmin(dim=1)]
    T = a.tokens_per_frame
    cfg = MemoryConfig(policy="rekv", budget_tokens=len(a.prefix_ids()) + 4 * T, local_window_tokens=T, offload_bytes=1 << 24,
                       retrieve_frames=2, page_tokens=4, rekv=ReKVConfig(selection=selection, words=0.5))
    e = VideoMemoryEngine(a, cfg, GenerationConfig(max_new_tokens=1))
    for f in frames:
        e.ingest([f])
    e.ask(Question("Did you see a dog?", max_new_tokens=1))
    e.generation.answer = dataclasses.replace(e.generation.answer, locate_rerank=2)
    found = e.locate(LocateQuery("the dog", top_k=2))
    out = [[b.words for b in e.store.blocks()], e.last_layer_stamps, found.method, [m.stamp_ns for m in found.moments]]
    e.close()
    return out


@pytest.mark.parametrize("selection", ["shared", "layer"])
def test_frame_words_retrieval_and_locate_the_same_on_cuda(selection):
    """Issue 34's words on both devices: the blocks' words, rekv's named blocks (the candidates' mask lives on the
    device) and ~/locate's words shortlist give the same frames; the noun block reads back on the device."""
    from videokv_node.models.videokv_tiny import VideoKVTinyAdapter

    assert _worded_answers("cuda", selection) == _worded_answers("cpu", selection)
    block = VideoKVTinyAdapter.tiny(device="cuda", nouns=True).nouns
    written = block.embed_slots(torch.tensor([[1, 2], [3, 0]], device="cuda"))
    want = [(block.nouns[1], block.nouns[2]), (block.nouns[3],)]
    assert block.read(written) == block.read(written.half()) == block.read(written.cpu()) == want
