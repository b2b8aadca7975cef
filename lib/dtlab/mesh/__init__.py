"""The named device mesh (dp, tp, pp, cp, ep): a layout checked before start, groups on ranks.

* :mod:`~dtlab.mesh.layout` — :class:`Layout`, pure arithmetic: validation, coordinates and the
  rank lists of every group, usable before any process exists.
* :mod:`~dtlab.mesh.layout_rules` — does this layout fit this model? Every layout rule (tp, pp,
  cp, ep against heads, layers, sequence, experts), used by the planner, ``compose``, every
  parallel family and the labs; pure arithmetic too. The one :func:`divisors` (and how a rule
  lists them as choices) sits below the rules in :mod:`~dtlab.mesh.divisors`.
* :mod:`~dtlab.mesh.rank_arithmetic` — which global ranks form each group of a row-major mesh
  (any shape and order, as ``init_device_mesh`` builds it) and which groups leave a node: the
  reversed-shape bug that puts TP across nodes, printed by :func:`rank_table`.
* :mod:`~dtlab.mesh.mesh` — :class:`Mesh`, the layout on a running rank: torch ``DeviceMesh``
  groups with sentence-like names (``mesh.tp_group``, ``mesh.is_first_pp_stage``), and
  :func:`split_into_groups`, its one-dimensional case (the world cut into blocks).

The mesh sits above :mod:`dtlab.runtime` (it builds its groups over the runtime's ranks, through
its group cache) and nothing in the runtime imports it.
"""

from dtlab.mesh.layout import ORDER, Layout, layouts_of
from dtlab.mesh.layout_rules import divisors, fit_check, model_layout_problems, validate_layout
from dtlab.mesh.mesh import Mesh, split_into_groups
from dtlab.mesh.rank_arithmetic import rank_table, row_major_groups

__all__ = [
    "ORDER",
    "Layout",
    "Mesh",
    "divisors",
    "fit_check",
    "layouts_of",
    "model_layout_problems",
    "rank_table",
    "row_major_groups",
    "split_into_groups",
    "validate_layout",
]
