"""``python -m videokv_node.eval``: replay a bag (or a text stream) and score the answers (``eval/cli.py``).

A command, not the library: with ``--via ros`` it hands the same arguments to
``python -m videokv_node.programs.evaluate`` (``programs/evaluate.py``: the node over DDS), so the command
documented before issue 19 keeps working while the eval package itself never imports ROS.
"""

import sys


def wants_ros(argv: list[str]) -> bool:
    """``--via ros`` or ``--via=ros`` among the arguments."""
    return "--via=ros" in argv or any(a == "--via" and b == "ros" for a, b in zip(argv, argv[1:]))


if __name__ == "__main__":
    if wants_ros(sys.argv[1:]):
        from videokv_node.programs.evaluate import main
    else:
        from videokv_node.eval.cli import main
    sys.exit(main())
