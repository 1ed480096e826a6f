"""The videokv node as a ROS 2 managed (lifecycle) node: ``lifecycle: true``.

The same work as the plain node (``ros/node.py``'s ``VideoKVMixin``), each step on its
transition, driven through ``<node>/change_state`` (lifecycle_msgs/srv/ChangeState):

    configure   read and check the parameters, load the model, build the memory
                (restore_on_start); a bad configuration or a model that does not load
                is FAILURE with the reason logged: the node stays up, unconfigured, and
                its parameters may be set before the next configure
    activate    restore a parked memory, start the model worker, create the camera
                subscriptions, services, ``~/ask`` action, publishers and timers
    deactivate  destroy all of those (an inactive node ingests nothing and offers no
                service), park the memory on host disk and free its device memory;
                the figures before and after are logged
    cleanup     write snapshot_on_shutdown if set, release the memory and the model
    shutdown    from any state: as cleanup, from wherever the node is

Any other exception inside a step is logged and the transition is ERROR: rclpy then
runs ``on_error``, which releases everything and returns the node to unconfigured.
"""

from __future__ import annotations

from rclpy.lifecycle import LifecycleNode, LifecycleState, TransitionCallbackReturn

from videokv_node.memory.config import ConfigError
from videokv_node.memory.snapshot.format import SnapshotError
from videokv_node.models.factory import ModelLoadError
from videokv_node.ros.node import NODE_NAME, VideoKVMixin
from videokv_node.ros.params import declare, read_settings

SUCCESS = TransitionCallbackReturn.SUCCESS
FAILURE = TransitionCallbackReturn.FAILURE
ERROR = TransitionCallbackReturn.ERROR


class VideoKVLifecycleNode(VideoKVMixin, LifecycleNode):
    """Starts unconfigured, with its parameters declared (writable until configure)."""

    def __init__(self, **kwargs) -> None:
        super().__init__(NODE_NAME, **kwargs)
        self._init_steps()
        declare(self, lifecycle=True)
        self.add_on_set_parameters_callback(self.parameters_callback)
        self.get_logger().info("unconfigured: waiting for configure (lifecycle node)")

    def on_configure(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Load the model and the memory; a configuration or model refused is FAILURE with the reason."""
        try:
            self.configure_step(read_settings(self))
        except (ConfigError, ModelLoadError) as exc:
            self.get_logger().error(f"configure failed, still unconfigured: {exc}")
            return FAILURE
        except Exception as exc:
            return self._raised("configure", exc)
        return SUCCESS

    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Start work; a parked memory that cannot come back is FAILURE (it stays parked)."""
        try:
            self.activate_step()
        except (SnapshotError, ConfigError, OSError) as exc:
            self._stop_work()
            self.get_logger().error(f"activate failed, still inactive: {exc}")
            return FAILURE
        except Exception as exc:
            return self._raised("activate", exc)
        return super().on_activate(state)  # lifecycle publishers (none today) follow the node

    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Stop work and free the memory's device memory (figures logged)."""
        try:
            self.deactivate_step()
        except Exception as exc:
            return self._raised("deactivate", exc)
        return super().on_deactivate(state)

    def on_cleanup(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Release the memory and the model."""
        try:
            self.cleanup_step()
        except Exception as exc:
            return self._raised("cleanup", exc)
        return SUCCESS

    def on_shutdown(self, state: LifecycleState) -> TransitionCallbackReturn:
        """From any primary state: release everything."""
        try:
            self.shutdown_step()
        except Exception as exc:
            return self._raised("shutdown", exc)
        return SUCCESS

    def on_error(self, state: LifecycleState) -> TransitionCallbackReturn:
        """A step raised: release everything and go back to unconfigured."""
        self.get_logger().error(f"a transition from {state.label} failed with an error: releasing everything, back to unconfigured")
        self.shutdown_step()
        return SUCCESS

    def _raised(self, step: str, exc: Exception) -> TransitionCallbackReturn:
        """rclpy turns an exception into ERROR without a word: say what it was first."""
        self.get_logger().error(f"{step} raised {exc!r}")
        return ERROR

    def destroy_node(self) -> None:
        """Process exit: release whatever the node still holds (as shutdown)."""
        self.shutdown_step()
        super().destroy_node()
