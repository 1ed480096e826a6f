"""Train ``videokv-tiny`` v6: ``python -m videokv_node.tinyvlm.train_v6 --head DIR --checkpoint DIR [--finish]``.

v6 (issue 43) = v5's projector and LoRA, fine-tuned on what a memory hands the decoder, with the drawn-things
head's words in every frame's block:

1. the things head (``models/things_head.py``) is trained first and alone (``tinyvlm.train_things_head``,
   minutes on its cache); here it is frozen and writes its words into the noun block (``NounBlock`` ``extra``);
2. the decoder's LoRA and the projector train on a mixture (``--hour-examples`` long examples of
   ``tinyvlm/hour_examples.py``: 8 to ``--max-frames`` frames of real footage, shapes among them, the hour's kinds
   of question; and v5's recipe at a smaller scale, so nothing v5 does is lost: column scenes, streams, photos,
   varied shapes, real things by name), answers' next-token loss with the engine's position gaps
   (``ProjectorTrainer``).

Resumable: every ``--checkpoint-every`` steps and at ``--time-limit`` the adapters, the projector, the optimiser
and the step go to ``--checkpoint`` (a few MB, meant for records/); a later run with the same arguments continues
from it, drawing the same batches it would have drawn. ``--finish`` merges and writes the weights directory (the
committed model's files and manifest) from the checkpoint, with the held-out check the tests pin.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import time
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from videokv_node.models.lora import DecoderLoRA
from videokv_node.models.nouns import NOUNS_FILE, NounBlock, NounConfig, read_noun_table
from videokv_node.models.things_head import HEAD_FILE, ThingHead
from videokv_node.models.videokv_tiny import LORA_FILE, MANIFEST_FILE, PROJECTOR_FILE, WEIGHTS_DIR, Projector
from videokv_node.tinyvlm.drawn import DrawnSampler
from videokv_node.tinyvlm.hour_examples import HourExampleSampler
from videokv_node.tinyvlm.mixture import parse_weights, v5_pick
from videokv_node.tinyvlm.train import lr_at
from videokv_node.tinyvlm.trainer import ProjectorTrainer
from videokv_node.tinyvlm.word_noise import WordNoise, WordNoiser

STATE_FILE = "state.pt"  # optimiser and step, beside the checkpoint's projector and LoRA


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--init-from", type=Path, default=WEIGHTS_DIR, help="v5's weights directory (projector, LoRA, nouns)")
    p.add_argument("--head", type=Path, required=True, help="directory of train_things_head's things.safetensors and report")
    p.add_argument("--head-frames", type=int, default=6000, help="as train_things_head's --train-frames: the same frames")
    p.add_argument("--feature-cache", type=Path, default=None, help="train_things_head's cache (drawn frames), also v5's scenes")
    p.add_argument("--checkpoint", type=Path, required=True)
    p.add_argument("--weights-from", type=Path, default=None,
                   help="start from this checkpoint's projector and LoRA (an earlier run's), with a fresh optimiser and "
                        "schedule: a second run at other rates")
    p.add_argument("--checkpoint-every", type=int, default=20)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--lr", type=float, default=2e-4, help="projector")
    p.add_argument("--lora-lr", type=float, default=3e-4)
    p.add_argument("--lora-targets", default="", help="'k_proj,o_proj': LoRA also on these attention projections, "
                   "new ones from zero (DecoderLoRA.widened; v6-run6); '' the init's targets")
    p.add_argument("--max-gap", type=int, default=96)
    p.add_argument("--gap-share", type=float, default=0.5)
    p.add_argument("--hour-examples", type=int, default=4000)
    p.add_argument("--hour-kind-weights", default="",
                   help="'hour colour=3,hour shape=3': the long examples' kinds drawn by these weights (others 1); "
                        "'' all alike")
    p.add_argument("--touching-share", type=float, default=0.0, help="HourExampleSampler's touching_share (run8 on)")
    p.add_argument("--glimpse-share", type=float, default=0.0, help="HourExampleSampler's glimpse_share (run8 on)")
    p.add_argument("--where-share", type=float, default=0.0, help="HourExampleSampler's where_share: 'where was the "
                   "<thing>?' (left, middle, right) over a shot")
    p.add_argument("--word-noise", default="", help="'drop=P,swap=P,false=P': the head's words in training as a held-out "
                   "frame gets them, sometimes missing, miscoloured or false (tinyvlm.word_noise); default none")
    p.add_argument("--min-frames", type=int, default=8)
    p.add_argument("--max-frames", type=int, default=40)
    p.add_argument("--v5-share", type=float, default=0.35, help="share of the mixture from v5's recipe")
    p.add_argument("--v5-kind-weights", default="",
                   help="'motion=4,digit=4': v5's examples drawn by these weights of their kind (others 1), with "
                        "replacement; '' a plain draw without replacement (v6-run1..3)")
    p.add_argument("--letter-share", type=float, default=0.3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--time-limit", type=float, default=None, help="checkpoint and stop after this many seconds")
    p.add_argument("--stop-at", type=int, default=None, help="checkpoint and stop at this step, the schedule still "
                   "--steps long: how v6-run1 and run2 ended (by time), reproducibly (scripts/train_videokv_tiny.sh)")
    p.add_argument("--finish", action="store_true", help="write the weights directory from the checkpoint and stop")
    p.add_argument("--head-only", action="store_true",
                   help="with --finish: the decoder and projector of --init-from unchanged, the head's words added "
                        "(v5.1: what the drawn-things head gives before the decoder is trained to read long contexts)")
    p.add_argument("--words-threshold", type=float, default=None,
                   help="the head's words are written from this probability (NounConfig.extra_threshold); default the "
                        "threshold the head's run chose by its own rule (false words on val); in training and with --finish "
                        "(a candidate: v6-head12k at 0.95, records/videokv-tiny/README.md). The manifest keeps both: "
                        "nouns.extra_threshold (used) and things_head.threshold (the head's rule)")
    p.add_argument("--out", type=Path, default=WEIGHTS_DIR)
    return p


def load_parts(args):
    """The decoder (LoRA unmerged), projector, head and noun block, as v5 left them and the head's run wrote."""
    from videokv_node.models.efficientnet_lite import load_efficientnet_lite0
    from videokv_node.models.smollm2 import load_smollm2

    llm, tokenizer = load_smollm2()
    init = json.loads((args.init_from / MANIFEST_FILE).read_text())
    projector = Projector(llm.config.hidden_size, **init["projector"])
    projector.load_state_dict(load_file(args.init_from / PROJECTOR_FILE), strict=True)
    lora = DecoderLoRA.from_config(llm, init["lora"])
    lora.load_state_dict(load_file(args.init_from / LORA_FILE), strict=True)
    if args.lora_targets:
        lora = lora.widened(llm, tuple(t for t in args.lora_targets.split(",") if t))
    report = json.loads((args.head / "things-head.json").read_text())
    head = ThingHead(hidden=report["hidden"])
    head.load_state_dict(load_file(args.head / HEAD_FILE), strict=True)
    head.eval().requires_grad_(False)
    config = dataclasses.replace(NounConfig(**{k: v for k, v in init["nouns"].items()}),
                                 extra_threshold=report["threshold"] if args.words_threshold is None else args.words_threshold)
    nouns = NounBlock(read_noun_table(args.init_from / config.file), tokenizer, llm.get_input_embeddings(), config,
                      extra=head.names)
    return llm, tokenizer, load_efficientnet_lite0(), projector, lora, head, nouns, init, report


def build_data(args, encoder, projector, head, nouns, log=print):
    """(examples, features, blocks, bare): the shuffled mixture and, per frame key, the projector's pooled input,
    the block's noun indices as the adapter would write them and as the classifier alone would (``--word-noise``)."""
    from videokv_node.tinyvlm.dataset import build_examples
    from videokv_node.tinyvlm.drawn_features import colour_cells, encode_drawn
    from videokv_node.tinyvlm.things import ThingSampler

    drawn = DrawnSampler("train", args.seed).frames(args.head_frames)  # train_things_head's training frames
    v5 = build_examples(args.seed, 1500, 1000, 400, 4, 200, 12, 1500, 600, 0.4)
    things = ThingSampler(args.seed, nouns.nouns, photo_crops=6, frame_crops=2)
    scenes = list(dict.fromkeys([s for ex in v5 for s in ex.scenes] + things.scenes()))
    feats = encode_drawn(args.feature_cache, encoder, head, projector, drawn + scenes, log=log)
    keys = list(feats)
    colour = colour_cells(head, keys)
    with torch.no_grad():
        probs = torch.cat([head.logits_from_cells(torch.cat([torch.stack([feats[k]["cells"] for k in keys[i : i + 512]]).float(),
                                                             colour[i : i + 512].float()], -1)).sigmoid()
                           for i in range(0, len(keys), 512)])
        logits = torch.stack([feats[k]["logits"] for k in keys])
        index, _ = nouns.top(logits, probs)
        bare, _ = nouns.top(logits, torch.zeros_like(probs))  # the head's words all missed
    blocks, bare = dict(zip(keys, index)), dict(zip(keys, bare))
    features = {k: feats[k]["pooled"] for k in keys}
    needles, background = defaultdict(list), defaultdict(list)
    for f in drawn:
        if len(f.things) == 1:
            needles[f.things[0].name].append(f)
        elif not f.things:
            background[f.source].append(f)
    shots = [fs[i : i + 6] for fs in background.values() for i in range(0, len(fs), 6)]
    hour = HourExampleSampler(args.seed, dict(needles), shots, (args.min_frames, args.max_frames), args.letter_share,
                              parse_weights(args.hour_kind_weights), args.touching_share, things.photo_crops(),
                              args.glimpse_share, args.where_share).examples(args.hour_examples)
    asked = things.questions(1500, {s: blocks[s].tolist() for s in things.scenes()}, scenes, 0.5, 4)
    rest = v5 + asked
    pick = v5_pick([ex.kind for ex in rest], round(args.v5_share / (1 - args.v5_share) * len(hour)),
                   parse_weights(args.v5_kind_weights, "--v5-kind-weights"), args.seed + 6)
    mixture = hour + [rest[i] for i in pick]
    order = torch.randperm(len(mixture), generator=torch.Generator().manual_seed(args.seed + 43))
    return [mixture[i] for i in order], features, blocks, bare


def batches(groups: list[list[int]], batch: int, seed: int, steps: int):
    """The batches' example indices, step by step, each from one group (long examples apart from v5's short ones:
    a batch is padded to its longest sequence), a group drawn in proportion to its size; the same for a run and
    its resumption."""
    gen = torch.Generator().manual_seed(seed)
    sizes = torch.tensor([len(g) for g in groups], dtype=torch.float)
    orders = [torch.randperm(len(g), generator=gen) for g in groups]
    cursors = [0] * len(groups)
    for _ in range(steps):
        k = int(torch.multinomial(sizes, 1, generator=gen))
        if cursors[k] + batch > len(orders[k]):
            orders[k], cursors[k] = torch.randperm(len(groups[k]), generator=gen), 0
        yield [groups[k][int(i)] for i in orders[k][cursors[k] : cursors[k] + batch]]
        cursors[k] += batch


def save_checkpoint(path: Path, projector, lora, opt, step: int, curve, gen_state, meta: dict) -> None:
    path.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().contiguous() for k, v in projector.state_dict().items()}, path / PROJECTOR_FILE)
    save_file({k: v.detach().contiguous() for k, v in lora.state_dict().items()}, path / LORA_FILE)
    torch.save({"step": step, "optimizer": opt.state_dict(), "curve": curve, "gap_generator": gen_state}, path / STATE_FILE)
    (path / "progress.json").write_text(json.dumps(meta | {"step": step, "loss_curve": curve}, indent=1) + "\n")


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    t0 = time.monotonic()
    llm, tokenizer, encoder, projector, lora, head, nouns, init, head_report = load_parts(args)
    if args.finish:
        return finish(args, llm, tokenizer, encoder, projector, lora, head, nouns, init, head_report)
    noise = WordNoise.parse(args.word_noise)  # refused before the minutes of building data
    examples, features, blocks, bare = build_data(args, encoder, projector, head, nouns)
    kinds = defaultdict(int)
    for ex in examples:
        kinds[ex.kind] += 1
    print(f"{len(examples)} examples, {len(features)} frames ({time.monotonic() - t0:.0f} s): {dict(kinds)}", flush=True)
    trainer = ProjectorTrainer(llm, tokenizer, projector, features, lora=lora, max_gap=args.max_gap,
                               gap_share=args.gap_share, seed=args.seed, nouns=nouns, blocks=blocks,
                               word_noise=WordNoiser(noise, nouns.nouns, nouns.extra) if noise else None, bare_blocks=bare)
    groups = [{"params": list(projector.parameters()), "peak": args.lr}, {"params": list(lora.parameters()), "peak": args.lora_lr}]
    opt = torch.optim.AdamW(groups, lr=args.lr, weight_decay=0.0)
    step, curve = 0, []
    if args.weights_from is not None and not (args.checkpoint / STATE_FILE).is_file():
        projector.load_state_dict(load_file(args.weights_from / PROJECTOR_FILE), strict=True)
        lora.load_narrower(load_file(args.weights_from / LORA_FILE))
        print(f"weights from {args.weights_from}", flush=True)
    if (args.checkpoint / STATE_FILE).is_file():
        projector.load_state_dict(load_file(args.checkpoint / PROJECTOR_FILE), strict=True)
        lora.load_state_dict(load_file(args.checkpoint / LORA_FILE), strict=True)
        state = torch.load(args.checkpoint / STATE_FILE, weights_only=False)
        opt.load_state_dict(state["optimizer"])
        step, curve = state["step"], state["curve"]
        trainer._gen.set_state(state["gap_generator"])
        print(f"resumed at step {step}", flush=True)
    if args.stop_at is not None and step >= args.stop_at:
        print(f"already at step {step} (--stop-at {args.stop_at}): nothing to train", flush=True)
        return
    meta = {"command": "python -m videokv_node.tinyvlm.train_v6 " + " ".join(sys.argv[1:] if argv is None else argv), "args": {k: str(v) for k, v in vars(args).items()},
            "examples": len(examples), "kinds": dict(kinds), "frames": len(features)}
    projector.train()
    acc, t_train = [], time.monotonic()
    groups = [[i for i, ex in enumerate(examples) if ex.kind.startswith("hour")],
              [i for i, ex in enumerate(examples) if not ex.kind.startswith("hour")]]
    for i, idx in enumerate(batches(groups, args.batch, args.seed, args.steps)):
        if i < step:
            continue
        for g in opt.param_groups:
            g["lr"] = lr_at(i, args.steps, g["peak"], warmup=max(1, args.steps // 20))
        loss = trainer.loss([examples[j] for j in idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        acc.append(loss.item())
        step = i + 1
        if step % 10 == 0 or step == args.steps:
            curve.append([step, round(sum(acc) / len(acc), 4)])
            acc = []
            print(f"step {step}/{args.steps} loss {curve[-1][1]:.4f} ({time.monotonic() - t_train:.0f} s)", flush=True)
        out_of_time = args.time_limit is not None and time.monotonic() - t0 > args.time_limit
        stop = out_of_time or step == args.stop_at
        if step % args.checkpoint_every == 0 or step == args.steps or stop:
            save_checkpoint(args.checkpoint, projector, lora, opt, step, curve, trainer._gen.get_state(), meta)
        if stop:
            print(f"{'stop-at' if step == args.stop_at else 'time limit'}: checkpointed at step {step}", flush=True)
            break


def finish(args, llm, tokenizer, encoder, projector, lora, head, nouns, init, head_report) -> None:
    """The weights directory from the checkpoint: projector, merged LoRA, head, noun table, manifest with the
    held-out check (tests/unit/test_videokv_tiny_weights.py)."""
    from videokv_node.models.videokv_tiny import VideoKVTinyAdapter
    from videokv_node.tinyvlm.heldout import CHECK_EXAMPLES, HELD_OUT_SEED, accuracy_by_kind, held_out_examples, right_answers

    if not args.head_only:
        projector.load_state_dict(load_file(args.checkpoint / PROJECTOR_FILE), strict=True)
        lora.load_state_dict(load_file(args.checkpoint / LORA_FILE), strict=True)
    progress = json.loads((args.checkpoint / "progress.json").read_text())
    args.out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in projector.state_dict().items()}, args.out / PROJECTOR_FILE)
    save_file({k: v.detach().contiguous() for k, v in lora.state_dict().items()}, args.out / LORA_FILE)
    save_file({k: v.contiguous() for k, v in head.state_dict().items()}, args.out / HEAD_FILE)
    if args.out.resolve() != args.init_from.resolve():
        (args.out / NOUNS_FILE).write_text((args.init_from / NOUNS_FILE).read_text())
    lora.merge_into(llm)
    adapter = VideoKVTinyAdapter(encoder, projector.eval(), llm, tokenizer, name="videokv-tiny", nouns=nouns, things=head)
    held_out = held_out_examples(48)
    right = right_answers(adapter, held_out)
    by_kind, overall = accuracy_by_kind(adapter, held_out, right)
    manifest = dict(init)
    if args.head_only:  # v5's decoder, projector, data and training as they were; the head and the check are new
        manifest.update({
            "version": "v5.1",
            "nouns": dataclasses.asdict(nouns.config),
            "things": head.config(),
            "things_head": {k: head_report[k] for k in ("command", "seed", "hidden", "steps", "batch", "lr", "frames",
                                                        "threshold", "max_false", "scores", "wall_s")},
            "held_out": dict(init["held_out"]) | {
                "accuracy": round(overall, 4), "by_kind": {k: round(v, 4) for k, v in sorted(by_kind.items())},
                "check": {"examples": CHECK_EXAMPLES, "accuracy": round(sum(right[:CHECK_EXAMPLES]) / CHECK_EXAMPLES, 4),
                          "right": right[:CHECK_EXAMPLES]}},
        })
        (args.out / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1) + "\n")
        print(json.dumps(manifest["held_out"], indent=1))
        return
    manifest.update({
        "version": "v6",
        "projector": projector.config(),
        "lora": lora.config(),  # wider than init's after --lora-targets
        "nouns": dataclasses.asdict(nouns.config),
        "things": head.config(),
        "trainable_parameters": sum(p.numel() for p in projector.parameters()) + sum(p.numel() for p in lora.parameters()),
        "things_head": {k: head_report[k] for k in ("command", "seed", "hidden", "steps", "batch", "lr", "frames", "threshold",
                                                    "max_false", "scores", "wall_s")},
        "data": dict(init["data"]) | {"v6": {
            "recipe": "tinyvlm/hour_examples.py HourExampleSampler over tinyvlm/drawn.py frames (train split), mixed with "
                      "v5's recipe at a smaller scale (train_v6.build_data)",
            "hour_examples": progress["args"]["hour_examples"], "frames": [progress["args"]["min_frames"], progress["args"]["max_frames"]],
            "v5_share": progress["args"]["v5_share"], "v5_kind_weights": progress["args"].get("v5_kind_weights", ""),
            "letter_share": progress["args"]["letter_share"], **{k: progress["args"][k] for k in ("touching_share", "glimpse_share") if k in progress["args"]},
            "kinds": progress["kinds"], "examples": progress["examples"], "distinct_frames": progress["frames"],
            "split": "tinyvlm/drawn.py SPLITS: train, val (choosing runs), test (reported; the hour's footage)"}},
        "training": {
            "command": progress["command"], "seed": args.seed, "steps": int(progress["args"]["steps"]), "steps_run": progress["step"],
            "batch": int(progress["args"]["batch"]), "peak_lr": float(progress["args"]["lr"]), "lora_lr": float(progress["args"]["lora_lr"]),
            "loss_curve": progress["loss_curve"], "schedule": "5% linear warm-up, cosine to 10%",
            "loss": "next-token cross-entropy of answer tokens",
            "position_gaps": {"max_gap": int(progress["args"]["max_gap"]), "share": float(progress["args"]["gap_share"])},
            "threads": args.threads, "niceness": os.nice(0),
            "machine": f"{platform.machine()} ({torch.get_num_threads()} threads)",
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
            "lineage": [{"what": "v5 (issue 34), the starting point", "command": init["training"].get("command"),
                         "loss_curve": init["training"]["loss_curve"]}] + list(init["training"].get("lineage") or []),
        },
        "held_out": {
            "seed": HELD_OUT_SEED, "examples": len(held_out), "accuracy": round(overall, 4),
            "by_kind": {k: round(v, 4) for k, v in sorted(by_kind.items())},
            "check": {"examples": CHECK_EXAMPLES, "accuracy": round(sum(right[:CHECK_EXAMPLES]) / CHECK_EXAMPLES, 4),
                      "right": right[:CHECK_EXAMPLES]},
            "how": "greedy answer of a plain forward over [prefix, frames, question], normalised, exact match",
        },
    })
    (args.out / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1) + "\n")
    print(json.dumps(manifest["held_out"], indent=1))


if __name__ == "__main__":
    main()
