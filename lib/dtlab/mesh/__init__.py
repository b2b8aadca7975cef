"""The named device mesh (dp, tp, pp, cp, ep): a layout checked before start, groups on ranks.

* :mod:`~dtlab.mesh.layout` — :class:`Layout`, pure arithmetic: validation, coordinates and the
  rank lists of every group, usable before any process exists.
* :mod:`~dtlab.mesh.mesh` — :class:`Mesh`, the layout on a running rank: torch ``DeviceMesh``
  groups with sentence-like names (``mesh.tp_group``, ``mesh.is_first_pp_stage``).
"""

from dtlab.mesh.layout import ORDER, Layout, divisors, layouts_of
from dtlab.mesh.mesh import Mesh

__all__ = ["ORDER", "Layout", "Mesh", "divisors", "layouts_of"]
