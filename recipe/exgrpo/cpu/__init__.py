"""CPU backend for verl 0.9.1: platform plugin, Hugging Face rollout, run config, offline assets (docs/cpu_backend.md).

Kept import-free: ``recipe.exgrpo.cpu.plugin`` is loaded by verl itself (``VERL_USE_EXTERNAL_MODULES``), and the
assets/run-config helpers must be importable without initialising verl.
"""

#: The rollouts the CPU backend runs (``actor_rollout_ref.rollout.name``): the Hugging Face ``generate()`` stand-in
#: and verl's vLLM rollout on the vLLM CPU stack (docs/cpu_backend.md). Every choice of a CPU rollout reads this.
CPU_ROLLOUTS = ("hf", "vllm")
