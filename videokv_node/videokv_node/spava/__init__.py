"""Spava (seed 003): sequence-parallel approximate attention for long-replay prefill.

Library code only: no rclpy here (the ROS action lives in ``videokv_node.ros.long_replay``).
Modules, in the order a prefill uses them: ``config`` (validated sizes), ``layout``
(anchor / ZigZag context blocks / question over 2W virtual hosts), ``selection``
(training-free passing blocks), ``kernels`` (attention with log-sum-exp), ``merge``
(log-sum-exp merge), ``oracle`` (single-process dense reference), ``shard``
(the distributed attention of one rank), ``attention`` (the ``spava`` function
registered with transformers), ``runner`` (prefill and decode of a decoder).
"""
