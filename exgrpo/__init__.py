"""ExGRPO: Experiential Group Relative Policy Optimization, framework-free core.

This package must never import verl or ray (tests/unit/test_no_framework_imports.py enforces it):
the verl adapter lives in ``recipe/exgrpo``.
"""

__version__ = "0.1.0"
