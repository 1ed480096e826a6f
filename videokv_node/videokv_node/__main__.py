"""``python -m videokv_node --ros-args ...`` starts the ROS 2 node."""

import sys

from videokv_node.ros.main import main

if __name__ == "__main__":
    sys.exit(main())
