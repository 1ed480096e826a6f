"""videokv-tiny's multiple choice with options worded as planners word them, written into docs/bench/options.md.

    python -m bench.option_wording [--scenes 24]      (make bench-options)

The measuring and the table are the installed package's (``videokv_node.tinyvlm.option_wording``, which prints
them); writing the repository's document is the bench's (issue 45: the installed package imports nothing of bench/).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from bench.report import update_document
from videokv_node.tinyvlm import option_wording

REPO = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.option_wording", description=__doc__.split("\n\n")[0])
    p.add_argument("--scenes", type=int, default=24, help="streams, colours and shapes in turn")
    p.add_argument("--out", default=str(REPO / option_wording.DOC), help="markdown file to update; '-' prints only")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    text = option_wording.run(args.scenes, f"python -m bench.option_wording --scenes {args.scenes}")
    print(text)
    if args.out != "-":
        update_document(Path(args.out), text, option_wording.BEGIN, option_wording.END)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
