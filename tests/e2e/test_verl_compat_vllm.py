"""The private vLLM (and verl-vLLM) names the recipe reaches through recipe/exgrpo/verl_compat.py are present in the
vLLM CPU stack the project builds (.venv-vllm); tests/integration/test_verl_compat.py checks verl's own."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_vllm_names_are_present_in_the_vllm_stack(vllm_python):
    proc = subprocess.run(
        [vllm_python, "-m", "recipe.exgrpo.verl_compat", "vllm"], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "vllm 0.27.1" in proc.stdout
