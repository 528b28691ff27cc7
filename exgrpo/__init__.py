"""ExGRPO: Experiential Group Relative Policy Optimization, framework-free core.

This package must never import verl or ray (tests/unit/test_no_framework_imports.py enforces it):
the verl adapter lives in ``recipe/exgrpo``.
"""

#: the project's version, the one place it is written (setup.py reads it; CHANGELOG.md says what each added)
__version__ = "0.2.0"
