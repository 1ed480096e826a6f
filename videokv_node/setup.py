"""ament_python build of videokv_node.

Python dependencies (torch, transformers, ...) are pinned in the repository's
requirements/ files and installed by scripts/setup_env.sh, not here: on a robot
they come from the same pinned files (see docs/OPERATIONS.md), never from colcon.
"""
from glob import glob

from setuptools import find_packages, setup

package_name = "videokv_node"

setup(
    name=package_name,
    version="0.1.0",
    packages=find_packages(exclude=["test", "tests"]),
    # The trained projector and LoRA adapters of `model: videokv-tiny` (safetensors + manifest), read next to its module.
    package_data={package_name + ".models": ["weights/videokv-tiny/*"]},
    data_files=[
        ("share/ament_index/resource_index/packages", ["resource/" + package_name]),
        ("share/" + package_name, ["package.xml"]),
        ("share/" + package_name + "/launch", glob("launch/*.launch.py")),
        # The params file, and the viewers' configurations beside it (RViz2, Foxglove: docs/OPERATIONS.md).
        ("share/" + package_name + "/config", glob("config/*.yaml") + glob("config/*.rviz") + glob("config/*.foxglove.json")),
    ],
    install_requires=["setuptools"],
    zip_safe=True,
    maintainer="videokv maintainers",
    maintainer_email="videokv@example.com",
    description="Bounded video KV-cache memory for robots, as a ROS 2 node.",
    license="Apache-2.0",
    entry_points={
        "console_scripts": [
            "videokv_node = videokv_node.ros.main:main",
        ],
    },
)
