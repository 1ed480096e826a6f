"""videokv: a robot's memory of what its cameras saw, kept as a Video-LLM's KV cache.

The library (``memory``, ``models``, ``ingest``, ``synthetic``) never imports rclpy;
the ROS 2 node in ``videokv_node.ros`` is a thin adapter over it.
"""

__version__ = "0.1.0"
