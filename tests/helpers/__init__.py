"""Helpers the tests share: plain modules, no tests.

A test file (``test_*.py``) holds tests only and is never imported by another module (tests/unit/test_import_graph.py
checks it): what two test files need lives here, or in a ``conftest.py`` where a fixture is its natural form.
"""
