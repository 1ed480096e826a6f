"""videokv-tiny's held-out evaluation written into docs/bench/tinyvlm.md.

    python -m bench.tinyvlm_eval --write [the arguments of python -m videokv_node.tinyvlm.evaluate]

The measuring and the tables are the installed package's (``videokv_node.tinyvlm.evaluate``, which prints them);
writing the repository's documents is the bench's (issue 45: the installed package imports nothing of bench/).
"""

from __future__ import annotations

import sys
from pathlib import Path

from bench.report import update_document
from videokv_node.tinyvlm import evaluate
from videokv_node.tinyvlm.report import DOC

REPO = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    p = evaluate.parser()
    p.prog = "python -m bench.tinyvlm_eval"
    p.add_argument("--write", action="store_true", help=f"write the results of the parts run into {DOC}")
    args = p.parse_args(argv)
    command = "python -m bench.tinyvlm_eval " + " ".join(sys.argv[1:] if argv is None else argv)
    results, parts = evaluate.run(args, command)
    for text, begin, end in evaluate.sections(args, results, parts):
        print(text)
        if args.write:
            update_document(REPO / DOC, text, begin, end)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
