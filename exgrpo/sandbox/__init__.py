"""Model-written Python in a fresh confined process: the interpreter behind the tool-integrated-reasoning tool.

``runner.py`` is the caller's side (limits, the process, its output, the cleanup); ``child.py`` runs by path in the
new interpreter and confines itself before the code runs. The protections and what they leave open: docs/tools.md.
"""

from exgrpo.sandbox.runner import SandboxLimits, SandboxResult, isolation_available, run_python

__all__ = ["SandboxLimits", "SandboxResult", "isolation_available", "run_python"]
