"""Evaluation with the tool: ``exgrpo.eval`` (samples, grading, avg@k / pass@1, tables, resuming) with every answer a
run of verl's tool agent loop, on the settings of the training run (docs/evaluation.md, "With the tool").

- ``settings``: what the evaluation takes from training (tool file, parser, turn and length limits, the tool's
  environment), read from the training run's hydra overrides;
- ``loop``: the backend (verl's ``ToolAgentLoop`` around the hf or vLLM engine) and its per-answer figures;
- ``cli``: ``python -m recipe.exgrpo.tool_eval run --backend hf|vllm --model M --data D.parquet --out OUT
  --training-overrides K=V ...`` (or ``--tools TOOL.py`` and the limits as flags).

``scripts/eval/eval_tir.sh`` runs it for the TIR checkpoints and, on CPU, for the calculator task's model (with and
without its tool: ``recipe.exgrpo.harness.tool_eval_cpu``). Nothing is imported here: the loop needs verl.
"""
