"""Evaluation of the memory by replaying streams and asking the questions a planner would ask.

``python -m videokv_node.eval BAG QUESTIONS --out DIR`` replays a rosbag2's camera
topics (``bag_io``) in bag time, through the engine in-process or through the node's
ROS API (``replay``), asks each question of an annotation file (``questions``) at its
``end_time``, and writes results incrementally (``results``). ``make_bag`` converts
videos and StreamingBench files into these inputs. The targets share one protocol
(``target``); the command line is ``cli`` (its shared options in ``arguments``).
Nothing here imports ROS: ``--via ros`` is the ROS adapter's command,
``python -m videokv_node.programs.evaluate`` (``programs/evaluate.py``, ``programs/replay_target.py``).
"""
