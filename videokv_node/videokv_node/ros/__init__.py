"""The ROS 2 front end: a thin node over the library. Everything here may import rclpy."""
