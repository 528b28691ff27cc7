#!/usr/bin/env bash
# ExGRPO with tool-integrated reasoning (TIR; ours, not a paper row): Qwen2.5-7B-Instruct solves the OpenR1-Math
# questions writing Python that a sandboxed tool runs (recipe/exgrpo/agent_tools/python_tool.py, the tool "python":
# every call a fresh confined process, exgrpo/sandbox/runner.py), through verl's tool agent loop. The recipe stores and
# replays the whole exchanges, tool answers included, with their loss masks (docs/algorithm.md §14). Every other
# setting is the instruct run's (scripts/train/exgrpo_qwen2.5_7b_instruct.sh: 500 steps, the released
# hyperparameters of docs/algorithm.md §11) except the ones marked below (docs/launch_scripts.md, "Tool-integrated
# reasoning"). GPUs: 8 (NNODES x N_GPUS_PER_NODE); vLLM tensor parallel 2.
#
#   PROMPT_STYLE=tir PARTS=train,valid MODEL_PATH=/models/Qwen2.5-7B-Instruct bash scripts/prepare_data.sh
#   MODEL_PATH=/models/Qwen2.5-7B-Instruct bash scripts/train/exgrpo_qwen2.5_7b_instruct_tir.sh [hydra overrides]
#
# Data: rows made with --prompt-style tir (data/openr1_tir/train.parquet, data/valid_tir/valid_id.parquet): a system
# instruction that offers the Python tool and asks for the answer in \boxed{}, and agent_name=tool_agent, which
# routes each row to verl's tool agent loop. The tool's schema is not in the data: verl passes it to the chat
# template, and Qwen2.5's writes it into the system prompt with the hermes format <tool_call>{json}</tool_call>.
#
# The sandbox's limits (exgrpo/sandbox/runner.py, SandboxLimits.from_env; any other EXGRPO_SANDBOX_* variable set here is
# passed on as well, e.g. EXGRPO_SANDBOX_CPU_S):
#   EXGRPO_SANDBOX_TIMEOUT_S          wall-clock seconds per call (default 10)
#   EXGRPO_SANDBOX_MEMORY_MB          address space per call, MB (default 512)
#   EXGRPO_SANDBOX_MAX_OUTPUT_BYTES   what the model reads of a call's output (default 512, = the tool-response cap)
#   EXGRPO_SANDBOX_REQUIRE_ISOLATION  1 (default): refuse to run code on a kernel without Landlock and seccomp;
#                                     0 runs it with what the kernel offers
#   EXGRPO_SANDBOX_SITE_PACKAGES      1 (default): the code may import what the trainer's environment has installed
#                                     (sympy, numpy), read-only; 0: the standard library only
# They reach the agent-loop workers, which call the tool, through the Ray job's runtime_env on every node
# (exgrpo_worker_env in common.sh), not through this shell's environment.
set -euo pipefail
# shellcheck source=scripts/train/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

export EXGRPO_SANDBOX_TIMEOUT_S="${EXGRPO_SANDBOX_TIMEOUT_S:-10}"
export EXGRPO_SANDBOX_MEMORY_MB="${EXGRPO_SANDBOX_MEMORY_MB:-512}"
export EXGRPO_SANDBOX_MAX_OUTPUT_BYTES="${EXGRPO_SANDBOX_MAX_OUTPUT_BYTES:-512}"
export EXGRPO_SANDBOX_REQUIRE_ISOLATION="${EXGRPO_SANDBOX_REQUIRE_ISOLATION:-1}"
export EXGRPO_SANDBOX_SITE_PACKAGES="${EXGRPO_SANDBOX_SITE_PACKAGES:-1}"
mapfile -t sandbox_vars < <(compgen -e EXGRPO_SANDBOX_ | sort)

exgrpo_prepare \
  --experiment exgrpo_qwen2.5_7b_instruct_tir \
  --steps 500 \
  --rollout-tp 2 \
  --think-gate false \
  --prompt-style tir \
  --model-hint "point it at Qwen2.5-7B-Instruct (a local Hugging Face directory)"
mt=actor_rollout_ref.rollout.multi_turn
EXGRPO_ARGS+=(
  # verl's tool agent loop (the rows' agent_name) with the recipe's Python tool, in the hermes format of
  # Qwen2.5's chat template; an absolute path: verl loads the file by path in every agent-loop worker
  "$mt.enable=true"
  "$mt.format=hermes"
  "$mt.function_tool_path=$(exgrpo_hydra_value "$EXGRPO_REPO_ROOT/recipe/exgrpo/agent_tools/python_tool.py")"
  # up to 4 tool calls, then a 5th turn for the answer: compute, check, fix a failed call, verify. A 5th call
  # would get no answer (verl stops first), and the recipe never stores an exchange that ends on an unanswered
  # call (docs/algorithm.md §14)
  "$mt.max_assistant_turns=5"
  "$mt.max_user_turns=4"
  # one call per turn: each runs in a fresh process, so two calls of one turn could not use each other's result
  "$mt.max_parallel_calls=1"
  # characters, not tokens (verl's cut); the sandbox already cuts its output to EXGRPO_SANDBOX_MAX_OUTPUT_BYTES =
  # 512 bytes (head of stdout, tail of a traceback), so this is the backstop; middle keeps both ends
  "$mt.max_tool_response_length=512"
  "$mt.tool_response_truncate_side=middle"
  # reward: the tool's answers are cut out of the decoded exchange before grading, so that a tool which prints
  # \boxed{...} is not graded as the model's answer; the TIR prompt asks for no think block: the gate is off
  "++reward.custom_reward_function.reward_kwargs.strip_tool_responses=true"
)
# The response length stays the released 8192 tokens for the whole exchange (model turns and tool answers): 4
# calls of ~300 tokens of code and <= ~200 of answer leave ~6k tokens of reasoning, more than the instruct model
# writes without tools; the memory settings and the loss normaliser (L_max) stay those of the instruct run.
exgrpo_worker_env "${sandbox_vars[@]}"
exgrpo_launch "$@"
