"""Mesh geometry: extents, points and sliceable shapes. Pure Python, no I/O."""

from .shape import Extent, Point, Shape

__all__ = ["Extent", "Point", "Shape"]
