"""Programs that use the videokv node from outside, as a user would: none of them is part of the running node.

- ``demo``: ``make demo``, the whole path over ROS 2 on a synthetic camera;
- ``client``: a small synchronous client of the node (the demo, the tests, planners' scripts);
- ``synthetic_camera``: the synthetic scene published as a camera;
- ``launcher``: the node started as its own process on an isolated DDS domain;
- ``evaluate`` and ``replay_target``: the bag evaluation with the node over DDS (``--via ros``);
- ``long_replay`` and ``long_replay_bag``: the Spava long-replay service's command (``torchrun``), its
  LongReplay action on rank 0 and the frames of a bag.

They may import ``ros/`` (its message conversions, the node to launch) and everything below it; nothing
in the library or the node imports them (``tests/unit/test_package_structure.py``).
"""
