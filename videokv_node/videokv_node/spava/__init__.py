"""Spava (seed 003): sequence-parallel approximate attention for long-replay prefill.

Library code only: no rclpy here (the ROS action lives in ``videokv_node.programs.long_replay``,
which calls ``server.main`` with rank 0's host; nothing here imports it). Modules, in the order a job uses them:
``config`` (validated sizes), ``layout`` (anchor / ZigZag context blocks / question over
2W virtual hosts), ``frames`` (frame parallelism), ``selection`` (training-free passing
blocks), ``kernels`` (attention with log-sum-exp), ``merge`` (log-sum-exp merge),
``collectives`` (async all-gathers with a deadline), ``shard`` (one rank's attention),
``oracle`` (single-process dense reference), ``attention`` (the ``spava`` function
registered with transformers), ``runner`` (prefill and decode of a decoder), ``job`` and
``worker`` (a long-replay job on one rank), ``server`` (each rank's ``main``).
"""
