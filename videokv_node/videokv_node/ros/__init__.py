"""The ROS 2 front end: the node and its surfaces, a thin layer over the library (programs that use the
node from outside: ``programs/``). Everything here may import rclpy."""
