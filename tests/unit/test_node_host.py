"""The node's surfaces see the node through ``ros/node_host.py``'s ``NodeHost`` only (issue 35).

Read from the source, as ``test_package_structure.py`` reads imports: no ROS is needed. A surface is a
module of ``ros/`` with a ``node`` parameter typed ``NodeHost``; every attribute it reads of that node
(``node.x``, ``self._node.x``, ``self.node.x``) must be declared on ``NodeHost``, and everything
``NodeHost`` declares beyond rclpy's ``Node`` must be something ``VideoKVMixin`` (``ros/node.py``) holds.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROS = Path(__file__).resolve().parents[2] / "videokv_node" / "videokv_node" / "ros"
WIRING = {"node.py", "lifecycle.py", "main.py", "node_host.py"}  # the node itself and its interface


def _tree(name: str) -> ast.Module:
    return ast.parse((ROS / name).read_text(), name)


def _class(tree: ast.Module, name: str) -> ast.ClassDef:
    return next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)


def _members(cls: ast.ClassDef) -> set[str]:
    """Names a class body declares: annotated or assigned attributes and methods."""
    out = set()
    for n in cls.body:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.add(n.name)
        elif isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
            out.add(n.target.id)
        elif isinstance(n, ast.Assign):
            out.update(t.id for t in n.targets if isinstance(t, ast.Name))
    return out


HOST_TREE = _tree("node_host.py")
ROS_NODE = _members(_class(HOST_TREE, "RosNode"))
NODE_HOST = _members(_class(HOST_TREE, "NodeHost")) | ROS_NODE


def node_reads(tree: ast.AST) -> set[str]:
    """Every attribute read of ``node``, ``self._node`` or ``self.node`` in ``tree``."""
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Attribute):
            v = n.value
            if (isinstance(v, ast.Name) and v.id == "node") or (
                    isinstance(v, ast.Attribute) and v.attr in ("_node", "node")
                    and isinstance(v.value, ast.Name) and v.value.id == "self"):
                out.add(n.attr)
    return out


def node_annotations(tree: ast.AST) -> list[str]:
    """The annotation of every parameter named ``node`` (``""`` where it has none)."""
    return [ast.unparse(a.annotation) if a.annotation is not None else ""
            for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
            for a in f.args.args + f.args.kwonlyargs if a.arg == "node"]


SURFACES = sorted(p.name for p in ROS.glob("*.py")
                  if p.name not in WIRING and "NodeHost" in node_annotations(_tree(p.name)))


def test_reads_are_found():
    tree = ast.parse("def f(node):\n    node.engine.ask()\n    self._node.adapter\n    other.x\n    self.node.worker\n")
    assert node_reads(tree) == {"engine", "adapter", "worker"}


def test_the_surfaces_are_those_of_the_issue():
    assert set(SURFACES) >= {"ask.py", "camera_intake.py", "diagnostics.py", "locate_service.py",
                             "memory_services.py", "snapshots.py", "status.py"}


@pytest.mark.parametrize("name", sorted(p.name for p in ROS.glob("*.py") if p.name not in WIRING))
def test_every_node_parameter_is_typed(name):
    """A part of the node takes it as ``NodeHost`` (it reads the node's state) or as rclpy's ``Node`` (ROS only)."""
    untyped = [a for a in node_annotations(_tree(name)) if a not in ("NodeHost", "Node")]
    assert not untyped, f"{name}: a node parameter typed {untyped}, not NodeHost or Node"


@pytest.mark.parametrize("name", SURFACES)
def test_surface_reads_only_the_host(name):
    extra = node_reads(_tree(name)) - NODE_HOST
    assert not extra, f"{name} reads {sorted(extra)} of the node: declare them on NodeHost (ros/node_host.py) or pass them"


def test_the_node_holds_what_the_host_declares():
    mixin = _class(_tree("node.py"), "VideoKVMixin")
    held = _members(mixin)
    for n in ast.walk(mixin):  # self.x = ... / self.x: T = ... anywhere in its methods
        targets = n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(n, ast.AnnAssign) else []
        held.update(t.attr for t in targets if isinstance(t, ast.Attribute)
                    and isinstance(t.value, ast.Name) and t.value.id == "self")
    missing = (NODE_HOST - ROS_NODE) - held
    assert not missing, f"NodeHost declares what VideoKVMixin does not hold: {sorted(missing)}"


def test_ros_part_is_rclpy_node_api():
    node = pytest.importorskip("rclpy.node", reason="ROS 2 (rclpy) is not installed").Node
    missing = sorted(m for m in ROS_NODE if not callable(getattr(node, m, None)))
    assert not missing, f"RosNode declares what rclpy's Node lacks: {missing}"


def test_the_host_declares_nothing_no_surface_uses():
    """``NodeHost`` is exactly what the surfaces use of the node: a member no surface reads is dropped from it."""
    used = set().union(*(node_reads(_tree(name)) for name in SURFACES))
    unused = NODE_HOST - used
    assert not unused, f"NodeHost declares what no surface reads: {sorted(unused)}"


def test_status_is_typed_as_what_the_surfaces_call():
    """``status`` is the status publishers' ``StatusSink`` (what a camera callback calls), not ``object``."""
    status = next(n for n in _class(HOST_TREE, "NodeHost").body if isinstance(n, ast.FunctionDef) and n.name == "status")
    assert status.returns is not None and ast.unparse(status.returns) == "StatusSink | None"
    assert _members(_class(HOST_TREE, "StatusSink")) == {"frame_received"}
