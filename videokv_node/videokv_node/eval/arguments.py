"""The evaluation commands' shared options: the memory's settings as the node's parameters.

Both ``python -m videokv_node.eval`` (a bag, ``eval/cli.py``) and its ``--text-stream``
form (``eval/text_stream.py``) take them, and both turn them into the node's parameter
names with ``memory_parameters``, so an evaluation runs the memory the node would run.
"""

from __future__ import annotations

import argparse

from videokv_node.memory.config import OPTION_SCORINGS, POLICIES  # light: the memory package loads its engine lazily

USAGE_ERROR, RUN_ERROR = 2, 1  # exit status: unusable inputs (nothing run); a run that failed part-way


def memory_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the memory settings' options (model, device, policy, budget, ``--param NAME=VALUE``) to ``parser``."""
    from videokv_node.node_settings import model_defaults

    node = model_defaults()  # the node's own defaults (videokv_node/node_settings.py; light: no torch for --help)
    g = parser.add_argument_group("memory settings (the node's parameters, config/memory.yaml)")
    g.add_argument("--model", default=node["model"],
                   help="videokv-tiny (the node's default), tiny or tiny-qwen2.5-vl (random weights), or a local checkpoint directory")
    g.add_argument("--device", default=node["device"])
    g.add_argument("--dtype", default=node["dtype"])
    g.add_argument("--seed", type=int, default=node["seed"], help="seed of a tiny model's random weights")
    g.add_argument("--torch-threads", type=int, default=node["torch_threads"], help="intra-op CPU threads (0: torch's default)")
    g.add_argument("--policy", choices=POLICIES, help=f"memory.policy: {', '.join(POLICIES)}")
    g.add_argument("--budget-tokens", type=int, help="memory.budget_tokens")
    g.add_argument("--sample-fps", type=float, help="frames per second per camera entering memory (0: all)")
    g.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                   help="any other node parameter, e.g. memory.retrieve_frames=4 (repeatable)")


def memory_parameters(args: argparse.Namespace) -> dict:
    """The node parameters the command line sets (explicit options win over --param)."""
    from videokv_node.eval.settings import parse_param, typed_parameters

    params = dict(parse_param(p) for p in args.param)
    params.update(model=args.model, device=args.device, dtype=args.dtype, seed=args.seed, torch_threads=args.torch_threads)
    scoring = getattr(args, "option_scoring", None)
    for name, value in (("memory.policy", args.policy), ("memory.budget_tokens", args.budget_tokens),
                        ("sample_fps", args.sample_fps),
                        ("answer.option_scoring", scoring if scoring in OPTION_SCORINGS else None)):
        if value is not None:
            params[name] = value
    return typed_parameters(params)
