"""``python -m videokv_node.eval``: replay a bag (or a text stream) and score the answers (``eval/cli.py``)."""

import sys

from videokv_node.eval.cli import main

if __name__ == "__main__":
    sys.exit(main())
