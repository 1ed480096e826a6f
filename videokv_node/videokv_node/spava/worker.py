"""One rank's part of every long-replay job: frame-parallel encoding, then per question a Spava prefill and an answer.

Every rank runs ``ReplayWorker.run`` on the same job in lockstep (the collectives
inside pair them up). Rank 0 alone reports progress and reads cancellation; its
decision to go on is broadcast at each checkpoint (after encoding, before each
question), so every rank stops at the same point. Questions are answered one
after the other, each with its own fused prefill (the question is part of the
prefill: its mean query picks the passing blocks) over the frames of its window.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from videokv_node.memory.questions.options import distinct_spans, option_texts, span_means
from videokv_node.models.adapter import VideoLLMAdapter
from videokv_node.spava.attention import use_spava_attention
from videokv_node.spava.collectives import broadcast_tensor
from videokv_node.spava.config import SpavaConfig
from videokv_node.spava.frames import frame_indices, gather_frame_embeddings
from videokv_node.spava.job import Progress, ReplayAnswer, ReplayJob, ReplayOutcome, ReplayQuestion
from videokv_node.spava.runner import ShardRunner

ProgressFn = Callable[[Progress], None]
CancelledFn = Callable[[], bool]


class JobCancelled(Exception):
    """Rank 0 was asked to cancel; every rank raises it at the same checkpoint."""


class _PrefillMeter:
    """Rank 0's progress: one tick per decoder layer of the current question's prefill, ETA from the pace so far."""

    def __init__(self, report: ProgressFn | None, frames: int, questions: int, layers: int) -> None:
        self.report, self.frames, self.questions, self.layers = report, frames, questions, layers
        self.t0 = time.monotonic()
        self.question, self.done_layers = 0, 0

    def start(self, question: int) -> Callable[[], None]:
        self.question, self.done_layers = question, 0
        return self.tick

    def _eta(self, done: float) -> float:
        return (time.monotonic() - self.t0) * (self.questions - done) / done if done > 0 else -1.0

    def tick(self) -> None:
        self.done_layers += 1
        if self.done_layers > self.layers:  # the layers run again for each decoded token: not prefill
            return
        frac = self.done_layers / self.layers
        self.report(Progress("prefill", self.frames, self.frames, self.question, self.questions, frac,
                             self._eta(self.question + frac)))

    def question_done(self, question: int) -> None:
        self.report(Progress("decoding", self.frames, self.frames, question + 1, self.questions, 1.0,
                             self._eta(question + 1)))


class ReplayWorker:
    """Holds the model and the job group of one rank; ``run`` answers a job's questions."""

    def __init__(self, adapter: VideoLLMAdapter, cfg: SpavaConfig, group, default_max_new_tokens: int = 64) -> None:
        if adapter.position_dims != 1:
            raise ValueError(f"the Spava service runs 1-D RoPE decoders only; {adapter.name} uses mRoPE")
        self.adapter, self.cfg = adapter, cfg
        self.default_max_new_tokens = default_max_new_tokens
        model = adapter.model
        use_spava_attention(model.config.text_config)
        self.decoder = model.model.language_model
        self.runner = ShardRunner(self.decoder, model.lm_head, cfg, group)
        self.group, self.rank, self.world = group, self.runner.rank, self.runner.world
        self._layer_done: Callable[[], None] | None = None
        for layer in self.decoder.layers:  # prefill progress: one tick per decoder layer (rank 0 reports it)
            layer.register_forward_hook(lambda *_: self._layer_done and self._layer_done())

    def _go_on(self, cancelled: CancelledFn | None) -> None:
        stop = self.rank == 0 and cancelled is not None and cancelled()
        flag = torch.tensor([int(stop)], device=self.adapter.device)  # NCCL needs CUDA tensors
        if broadcast_tensor(flag, 0, self.group, "job: cancel flag", self.cfg.timeout_s)[0]:
            raise JobCancelled("canceled")

    @torch.inference_mode()
    def run(self, job: ReplayJob, progress: ProgressFn | None = None, cancelled: CancelledFn | None = None) -> ReplayOutcome:
        start = time.monotonic()
        report = progress if self.rank == 0 else None
        n, nq = len(job.frames), len(job.questions)
        mine = frame_indices(n, self.world, self.rank, self.cfg.zigzag)
        if report:
            report(Progress("encoding", 0, n, 0, nq, 0.0, -1.0))
        local = self.adapter.encode_frames([job.frames[i] for i in mine]) if mine else None
        if local is None:  # fewer frames than virtual hosts: this rank has none, it still gathers
            t, h = self.adapter.tokens_per_frame, self.decoder.config.hidden_size
            local = torch.zeros((0, t, h), dtype=self.adapter.geometry.dtype, device=self.adapter.device)
        frames = gather_frame_embeddings(local, n, self.world, self.rank, self.group, self.cfg.timeout_s, self.cfg.zigzag)
        encode_s = time.monotonic() - start
        out = ReplayOutcome(True, "", [], frames=n, world_size=self.world, encode_s=encode_s)
        if report:
            report(Progress("prefill", n, n, 0, nq, 0.0, -1.0))
        meter = _PrefillMeter(report, n, nq, len(self.decoder.layers))
        for qi, question in enumerate(job.questions):
            self._go_on(cancelled)
            self._layer_done = meter.start(qi) if report else None
            out.answers.append(self._answer(job, question, frames, start, out))
            self._layer_done = None
            if report:
                meter.question_done(qi)
        return out

    def _answer(self, job: ReplayJob, q: ReplayQuestion, frames: torch.Tensor, start: float, out: ReplayOutcome) -> ReplayAnswer:
        idx = job.frames_for(q)
        if not idx:
            return ReplayAnswer(False, "no frame of the replay lies in the question's window and cameras")
        a = self.adapter
        by_likelihood = bool(q.options) and q.option_scoring == "likelihood"
        try:
            # Likelihood: the question asked open, each option's text scored as its answer.
            texts = option_texts(q.options)  # labels such as "A)" dropped (memory/questions/options.py)
            q_ids = a.question_ids(q.question, [] if by_likelihood else texts)
            letters = a.option_token_ids(len(q.options)) if q.options and not by_likelihood else []
            option_ids = [a.text_ids(o) for o in texts] if by_likelihood else []
        except ValueError as exc:
            return ReplayAnswer(False, str(exc))
        if any(not ids for ids in option_ids):
            return ReplayAnswer(False, "options must not be empty strings")
        video = frames[idx].reshape(1, -1, frames.shape[-1])  # (1, F * T, hidden)
        embeds = torch.cat([a.embed_tokens(a.prefix_ids()), video.to(a.geometry.dtype), a.embed_tokens(q_ids)], dim=1)
        t0 = time.monotonic()
        logits = self.runner.prefill(embeds, len(q_ids))
        out.prefill_s += time.monotonic() - t0
        ttft = time.monotonic() - start
        ans = ReplayAnswer(True, evidence_stamps_ns=[job.stamps_ns[i] for i in idx],
                           evidence_cameras=[job.cameras[i] for i in idx], ttft_s=ttft)
        t0 = time.monotonic()
        if by_likelihood:
            # As the engine's likelihood scoring (memory/questions/answering.py _ask_by_likelihood): options of
            # different lengths compared by the mean log-probability per token over the tokens that
            # tell them apart (memory/questions/options.py distinct_spans); scores = softmax.
            spans = distinct_spans(option_ids)
            per_token = self.runner.score_continuations(logits, a.embed_tokens, [ids[:b] for ids, (_, b) in zip(option_ids, spans)])
            probs = torch.softmax(torch.tensor(span_means(per_token, spans), dtype=torch.float64), dim=0)
            ans.option_index = int(probs.argmax())
            ans.option_scores = [float(p) for p in probs]
            ans.answer = q.options[ans.option_index]
            ans.ttft_s = time.monotonic() - start  # multiple choice: the time to the scores
        elif q.options:
            probs = torch.softmax(logits[letters].float(), dim=0)
            ans.option_index = int(probs.argmax())
            ans.option_scores = [float(p) for p in probs]
            ans.answer = q.options[ans.option_index]
        else:
            budget = q.max_new_tokens or self.default_max_new_tokens
            ids = self.runner.generate(logits, a.embed_tokens, budget, a.eos_token_ids)
            ans.answer = a.decode(ids)
        out.decode_s += time.monotonic() - t0
        ans.total_s = time.monotonic() - start
        return ans
