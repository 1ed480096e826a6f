"""What the robot remembers, made visible (issue 46): the memory read as plain records (``memory_view``),
drawn as marker content (``markers``) and as a contact sheet (``contact_sheet``). No ROS here: ``ros/memory_view.py``
turns the content into ``visualization_msgs/MarkerArray`` and ``sensor_msgs/CompressedImage``."""
