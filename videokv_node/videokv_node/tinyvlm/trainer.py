"""The stage-2 loss of ``videokv-tiny``: answers' next-token loss through the frozen decoder, laid out as the
memory engine lays a stream out (``ProjectorTrainer``, ``layout_mask``, ``gapped_positions``)."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from transformers.cache_utils import DynamicCache

from videokv_node.models.chat_adapter import OPTION_LETTERS, SYSTEM_PROMPT
from videokv_node.models.lora import DecoderLoRA
from videokv_node.models.nouns import NounBlock
from videokv_node.models.videokv_tiny import Projector
from videokv_node.tinyvlm.align import cell_targets
from videokv_node.tinyvlm.scenes import Example, Scene
from videokv_node.tinyvlm.word_noise import WordNoiser


class ProjectorTrainer:
    """Next-token loss of the answers through the decoder, gradients only into the projector (and LoRA).

    Sequence of an example, as the adapter and the memory engine lay it out:
    [prefix (cached KV)] [frame tokens, T per frame] [question_ids] [answer ids, <|im_end|>].
    """

    def __init__(self, llm, tokenizer, projector: Projector, features: dict[Scene, torch.Tensor], align_weight: float = 0.0,
                 lora: DecoderLoRA | None = None, max_gap: int = 0, gap_share: float = 0.5, seed: int = 0,
                 window_share: float = 0.0, max_lead: int = 0, nouns: NounBlock | None = None,
                 blocks: dict[Scene, torch.Tensor] | None = None, word_noise: WordNoiser | None = None,
                 bare_blocks: dict[Scene, torch.Tensor] | None = None):
        """``align_weight``: weight of stage 1's alignment loss (``cell_targets``) on the batch's frames,
        added to the answer loss. Our choice: without it the answer loss alone pulled the tokens away
        from the words stage 1 put them on (in the first model, held-out colour tokens ended nearest
        no colour word at all) faster than it taught the decoder to read them.

        ``lora``: trained with the projector, applied by hooks until ``detach_lora``. The prefix KV
        then changes as the adapters learn, so it is recomputed every step (forward only: our
        choice, the gradient through the prefix's keys and values is dropped; a prefix of 23
        tokens, against about 60 per sequence that do get it).

        ``max_gap`` > 0: a ``gap_share`` of the examples get position gaps of 0 to ``max_gap`` before each
        frame and before the question (``gapped_positions``). Why: the memory engine does not lay frames out
        back to back after the prompt as a plain forward does. A question over a time window sees its frames
        at their stream positions with the others masked, ReKV brings back frames from anywhere in the
        stream, and the question sits after everything ingested. Trained on contiguous layouts only, the
        model answered the demo's windowed questions differently from a plain forward over the same frames.

        ``window_share`` > 0: that share of the examples is also encoded as the memory engine encodes a
        stream (``layout_mask``): each frame attends to the prompt, itself and only the ``w`` frames before
        it (``w`` drawn from 0, every frame encoded alone as ReKV with a one-token local window does, to all
        of them), after 0 to ``max_lead`` lead-in frames of other scenes that the frames may attend to but
        the question may not (a question over a time window, or ReKV's retrieval, leaves out frames the
        kept ones were encoded against). Why: trained on joint causal encoding only, the model read the
        order of frames from their mutual attention; with each frame encoded alone (the demo's ReKV
        memory) motion and "which came first" fell to chance on held-out streams (motion 1.00 -> 0.29,
        first 0.93 -> 0.47) while a plain forward over the same frames stayed right.

        Measured in two training runs (2026-11-23), and why the committed model
        was trained without it (``window_share`` 0): with ``window_share`` 0.5 motion held under every
        layout (1.00 with each frame encoded alone, was 0.29), but colour reading fell, on single frames
        too. On the manifest's 48 held-out examples: overall 0.77 -> 0.50 (``max_lead`` 2) and 0.54
        (``max_lead`` 0); colour 1.00 -> 0.33; first/last colour 0.75/0.50 -> 0.25/0.25. Not understood yet; the
        layouts stay here, parity-tested, for the next attempt (e.g. fewer isolated layouts, more steps)."""
        self.llm, self.tok, self.projector, self.features = llm, tokenizer, projector, features
        # v5: each frame's noun block follows its visual tokens, as VideoKVTinyAdapter.vision_forward lays it:
        # the classifier's nouns (``blocks``: scene -> (slots,) noun indices), or the example's own (Example.nouns)
        self.nouns, self.blocks = nouns, blocks
        # ``word_noise`` (tinyvlm.word_noise.WordNoiser): each showing of a frame's block (``blocks``) may lose its
        # head words (to ``bare_blocks``, the classifier's alone), change their colour or gain a false one. It draws
        # from ``self._gen`` only when given, so runs without it keep their draws (and resume from checkpoints)
        self.word_noise, self.bare_blocks = word_noise, bare_blocks
        if word_noise is not None and (blocks is None or bare_blocks is None):
            raise ValueError("word noise needs the blocks with and without the head's words")
        self.max_gap, self.gap_share = max_gap, gap_share
        self.window_share, self.max_lead = window_share, max_lead
        self._leads = list(features)  # lead-in frames are drawn from every scene with features
        self._gen = torch.Generator().manual_seed(seed)
        llm.requires_grad_(False)
        self.lora = lora
        self._hooks = lora.attach(llm) if lora is not None else []
        self.embed = llm.get_input_embeddings()
        self.align_weight = align_weight
        self.targets, self.target_scale = (cell_targets(features, tokenizer, self.embed) if align_weight else (None, 1.0))
        self.end_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.prefix = self._ids(f"<|im_start|>system\n{SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\n")
        self._prefix_caches: dict[int, DynamicCache] = {}

    def _ids(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False)

    def question_ids(self, question: str, options: tuple[str, ...] = ()) -> list[int]:
        """As ``ChatVideoLLMAdapter.question_ids(question, options)``: with options, the node's letter format
        (tests/unit/test_tiny_vlm_variety.py checks the two agree token for token)."""
        text = f"\n{question.strip()}"
        if options:
            lines = "\n".join(f"{OPTION_LETTERS[i]}. {opt.strip()}" for i, opt in enumerate(options))
            text += f"\n{lines}\nAnswer with the option's letter from the given choices directly."
        return self._ids(f"{text}<|im_end|>\n<|im_start|>assistant\n")

    def parameters(self) -> list[torch.nn.Parameter]:
        return list(self.projector.parameters()) + (list(self.lora.parameters()) if self.lora is not None else [])

    def detach_lora(self) -> None:
        """Remove the training hooks (before merging the adapters into the weights)."""
        for h in self._hooks:
            h.remove()
        self._hooks = []

    @torch.no_grad()
    def _prefix_cache(self, batch: int) -> DynamicCache:
        """A fresh copy of the prefix KV for ``batch`` sequences (computed once per batch size; every
        call while LoRA adapters train, since they change it)."""
        if self.lora is not None:
            cache = DynamicCache()
            self.llm.model(input_ids=torch.tensor([self.prefix]), past_key_values=cache, use_cache=True)
            cache.batch_repeat_interleave(batch)
            return cache
        if batch not in self._prefix_caches:
            cache = DynamicCache()
            ids = torch.tensor([self.prefix] * batch)
            self.llm.model(input_ids=ids, past_key_values=cache, use_cache=True)
            self._prefix_caches[batch] = cache
        return copy.deepcopy(self._prefix_caches[batch])

    def _layout(self, n_frames: int) -> tuple[list[Scene], int | None]:
        """(lead-in scenes, encoding window in frames; None: all before) of one example."""
        if not self.window_share or torch.rand((), generator=self._gen) >= self.window_share:
            return [], None
        n_lead = int(torch.randint(0, self.max_lead + 1, (), generator=self._gen)) if self._leads else 0
        leads = [self._leads[int(i)] for i in torch.randint(0, len(self._leads), (n_lead,), generator=self._gen)]
        return leads, int(torch.randint(0, n_lead + n_frames, (), generator=self._gen))

    def _block(self, scene: Scene) -> torch.Tensor:
        """The noun indices this showing of ``scene`` gets: the classifier's and head's, or with word noise."""
        if self.word_noise is None:
            return self.blocks[scene]
        return self.word_noise(self.blocks[scene], self.bare_blocks[scene], self._gen)

    def loss(self, batch: list[Example]) -> torch.Tensor:
        """Mean cross-entropy over every answer token (and the closing <|im_end|>) of the batch."""
        layouts = [self._layout(len(ex.scenes)) for ex in batch]
        scenes = list(dict.fromkeys(s for ex, (leads, _) in zip(batch, layouts) for s in leads + list(ex.scenes)))
        tokens = self.projector.project(torch.stack([self.features[s] for s in scenes]))  # (S, T, hidden)
        row = {s: i for i, s in enumerate(scenes)}
        seqs, targets, positions, n_texts = [], [], [], []
        P = len(self.prefix)
        T = tokens.shape[1] + (self.nouns.tokens if self.nouns is not None else 0)
        for ex, (leads, window) in zip(batch, layouts):
            frames = leads + list(ex.scenes)
            visual = tokens[[row[s] for s in frames]]  # (F, rows * cols, hidden), lead-ins first
            if self.nouns is not None:
                index = torch.stack([self._block(s) for s in leads] + [
                    torch.tensor(ex.nouns[j]) if ex.nouns is not None else self._block(s) for j, s in enumerate(ex.scenes)])
                visual = torch.cat([visual, self.nouns.embed_slots(index)], 1)  # (F, T, hidden)
            visual = visual.flatten(0, 1)  # (F*T, hidden)
            q = self.question_ids(ex.question, ex.options)
            a = self._ids(ex.answer) + [self.end_id]
            text = self.embed(torch.tensor(q + a[:-1]))  # (len(q) + len(a) - 1, hidden)
            seqs.append(torch.cat([visual, text]))
            first = visual.shape[0] + len(q) - 1  # the index whose output predicts a[0]
            targets.append((first, a))
            gap = self.max_gap if self.max_gap and torch.rand((), generator=self._gen) < self.gap_share else 0
            positions.append(gapped_positions(P, len(frames), T, text.shape[0], gap, self._gen))
            n_texts.append(text.shape[0])
        L = max(s.shape[0] for s in seqs)
        embeds = torch.stack([F.pad(s, (0, 0, 0, L - s.shape[0])) for s in seqs])  # (B, L, hidden), right padded
        # The right padding continues each sequence's positions; causal, so real tokens never see it.
        position_ids = torch.stack([torch.cat([p, p[-1] + 1 + torch.arange(L - len(p))]) for p in positions])
        mask = None  # plain causal attention, unless an example is laid out as the engine encodes
        if any(leads or window is not None for leads, window in layouts):
            allowed = torch.stack([layout_mask(len(leads), len(ex.scenes), T, n_text, window, P, L)
                                   for ex, (leads, window), n_text in zip(batch, layouts, n_texts)])
            mask = torch.zeros(allowed.shape, dtype=embeds.dtype).masked_fill(~allowed, torch.finfo(embeds.dtype).min)
            mask = mask[:, None]  # (B, 1, L, P + L): a 4D mask, which transformers applies as given
        out = self.llm.model(
            inputs_embeds=embeds,
            attention_mask=mask,
            position_ids=position_ids,
            past_key_values=self._prefix_cache(len(batch)),
            use_cache=True,
        )
        hidden = torch.cat([out.last_hidden_state[b, first : first + len(a)] for b, (first, a) in enumerate(targets)])
        labels = torch.tensor([t for _, a in targets for t in a])
        loss = F.cross_entropy(self.llm.lm_head(hidden).float(), labels)
        named = [i for i, s in enumerate(scenes) if s in self.targets] if self.align_weight else []
        if named:  # photos have no cell words: the leash holds only the rendered frames
            y = torch.stack([self.targets[scenes[i]] for i in named])
            loss = loss + self.align_weight * (tokens[named] - y).pow(2).mean() / self.target_scale
        return loss


def layout_mask(n_lead: int, n_frames: int, per_frame: int, n_text: int, window: int | None, prefix: int,
                length: int) -> torch.Tensor:
    """Which keys each query of one training sequence attends to, as the memory engine lays a stream out.

    The sequence is [prefix][lead-in frames][frames][text][right padding] (``length`` tokens after the
    prefix); returns a boolean (length, prefix + length), True: attended. Every real token attends to the
    prefix (the engine's sink). A frame token attends causally within its frame and to the ``window``
    frames before it (None: all, a plain causal forward), lead-ins included: the engine's sliding-window
    encoding. A text token attends to the text before it and to the frames, not the lead-ins: a question
    over the frames it was given. Padding attends to the prefix alone (no empty softmax row).
    """
    frame = torch.full((length,), -2)  # -2: padding, -1: text, >= 0: frame index (lead-ins first)
    n_visual = (n_lead + n_frames) * per_frame
    frame[:n_visual] = torch.arange(n_lead + n_frames).repeat_interleave(per_frame)
    frame[n_visual : n_visual + n_text] = -1
    q, k = frame[:, None], frame[None, :]
    causal = torch.arange(length)[None, :] <= torch.arange(length)[:, None]
    sees_frame = (k >= 0) & (k <= q) & ((k >= q - window) if window is not None else True)
    sees_text = (k == -1) | (k >= n_lead)
    allowed = causal & (((q >= 0) & sees_frame) | ((q == -1) & sees_text))
    return torch.cat([torch.ones(length, prefix, dtype=torch.bool), allowed], 1)


def gapped_positions(start: int, n_frames: int, per_frame: int, n_text: int, max_gap: int,
                     gen: torch.Generator) -> torch.Tensor:
    """Positions of [frames][text] after a prompt of ``start`` tokens: each frame's tokens consecutive, a
    gap drawn from 0 to ``max_gap`` before each frame and before the text (``max_gap`` 0: back to back)."""
    gaps = torch.randint(0, max_gap + 1, (n_frames + 1,), generator=gen).tolist() if max_gap else [0] * (n_frames + 1)
    out, p = [], start
    for f in range(n_frames):
        p += gaps[f]
        out.append(torch.arange(p, p + per_frame))
        p += per_frame
    out.append(torch.arange(p + gaps[-1], p + gaps[-1] + n_text))
    return torch.cat(out)
