# shellcheck shell=bash
# Shared code of the ExGRPO launch scripts (scripts/train/*.sh, scripts/reproduce/*.sh); docs/launch_scripts.md.
#
#   source "$(dirname "${BASH_SOURCE[0]}")/common.sh"          # in a launch script
#   bash scripts/train/common.sh ray-head|ray-worker ADDR|ray-wait [N]|ray-status|ray-stop   # Ray cluster helpers
#
# Environment of every launch script:
#   MODEL_PATH       (required) backbone: a local Hugging Face directory (or a Hub id)
#   TRAIN_FILE       training parquet; default data/openr1/train.parquet (Llama-3.1-8B base:
#                    data/openr1/train_llama_base.parquet; TIR: data/openr1_tir/train.parquet) when it exists. A
#                    hydra list "[a.parquet,b.parquet]" is passed as it is. bash scripts/prepare_data.sh writes every
#                    file at its default path.
#   VAL_FILE         in-training validation parquet; default data/valid/valid_id.parquet (Llama-3.1-8B base:
#                    data/valid_llama_base/valid_id.parquet; TIR: data/valid_tir/valid_id.parquet) when it exists
#   CKPT_KEEP        checkpoints kept (trainer.max_actor_ckpt_to_keep; default 2, as the release; "all" keeps
#                    every one). A 7B checkpoint with its optimizer state is ~91 GB (docs/launch_scripts.md).
#   CKPT_DIR         checkpoint root (default <repo>/checkpoints); a run writes $CKPT_DIR/$PROJECT_NAME/$EXPERIMENT_NAME
#                    (on several nodes: a directory every node sees)
#   PROJECT_NAME     (default exgrpo); EXPERIMENT_NAME (default: the script's own)
#   N_GPUS_PER_NODE  (default 8); NNODES (default 1); ROLLOUT_TP vLLM tensor parallel size (default: the script's)
#   TRAINER          verl's trainer: legacy (default; RayPPOTrainer) or v1 (its v1 trainer in the sync mode:
#                    trainer.use_v1=true); docs/trainer.md says when to pick which
#   MODE             the v1 trainer's mode: sync (default), colocate_async (rollout generates while the trainer
#                    updates, partial rollout; docs/algorithm.md §15) or separate_async (the rollout on GPUs of its
#                    own: ROLLOUT_GPUS_PER_NODE of each node, default half; PARAMETER_SYNC_STEP local updates per
#                    weight sync, default 2; CKPT_ENGINE, default nccl); an async MODE implies TRAINER=v1
#   RAY_ADDRESS      a running Ray cluster to join (required when NNODES > 1; "auto" on its head node)
#   PYTHON           python of the environment with verl 0.9.1 and vLLM (default: an activated environment's
#                    python, else the checkout's .venv, else python on PATH: the first that has the packages the
#                    command needs; scripts/lib/python.sh). The scripts say which one they use.
#   DRY_RUN          0 = launch (default); 1 = compose the full hydra config and validate it, print it, launch
#                    nothing (unset paths get placeholders); print = print the hydra overrides only (no python)
#   DRY_RUN_QUIET    1: with DRY_RUN=1, print only the one-line summary, not the resolved config
#   PREFLIGHT        1 (default): a launch runs the DRY_RUN=1 checks first (about 20 s); 0 skips them
#   CHECK_CONTEXT    1 (default): refuse a local model whose max_position_embeddings < prompt + response tokens
#                    (vLLM would silently cut the responses short; the dry run checks it too); 0 skips the check
#   CHECK_RAY        1 (default): with RAY_ADDRESS, refuse to start when the cluster has fewer GPUs than
#                    NNODES x N_GPUS_PER_NODE (verl would wait for them forever); 0 skips the check
# Extra arguments of a launch script are hydra overrides appended last, so they win over the script's settings.

EXGRPO_REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
EXGRPO_TRAIN_DIR="$EXGRPO_REPO_ROOT/scripts/train"
# shellcheck source=scripts/lib/python.sh
source "$EXGRPO_REPO_ROOT/scripts/lib/python.sh"
# Released lengths (docs/algorithm.md §11); also used by the context-length check.
EXGRPO_MAX_PROMPT_LENGTH=1024
EXGRPO_MAX_RESPONSE_LENGTH=8192
# The Llama-3.1-8B base prompt is complete in the data (data_preprocess --prompt-style llama_base): this chat
# template renders it verbatim after the BOS token. Same string as exgrpo/prompts.py:RAW_CHAT_TEMPLATE (a test
# checks it); double quotes only, as it travels inside a single-quoted hydra value.
EXGRPO_RAW_CHAT_TEMPLATE='{{ bos_token }}{% for message in messages %}{{ message["content"] }}{% endfor %}'
# Markers of DRY_RUN=print output (one block per launch; tests/integration/test_launch_scripts_dry_run.py reads them).
EXGRPO_PRINT_BEGIN="# >>> python -m recipe.exgrpo.main_exgrpo"
EXGRPO_PRINT_END="# <<<"
EXGRPO_ARGS=()
EXGRPO_PLACEHOLDERS=()

exgrpo_log() { echo "[exgrpo] $*" >&2; }
exgrpo_die() {
  echo "[exgrpo] error: $*" >&2
  exit 2
}

case "${DRY_RUN:-0}" in
  0 | "" | false | no) EXGRPO_MODE=launch ;;
  1 | true | yes | check) EXGRPO_MODE=check ;;
  print) EXGRPO_MODE=print ;;
  *) exgrpo_die "DRY_RUN=${DRY_RUN}: use 0 (launch), 1 (compose and validate the config) or print (the overrides)" ;;
esac

# exgrpo_use_python MODULE...: choose PYTHON once (scripts/lib/python.sh): the first interpreter that finds every
# MODULE, and say which. With DRY_RUN=print no Python runs: PYTHON is then only the name shown.
exgrpo_use_python() {
  [[ -z "${EXGRPO_PYTHON_PICKED:-}" ]] || return 0
  EXGRPO_PYTHON_PICKED=1
  if [[ "$EXGRPO_MODE" == print ]]; then
    PYTHON="${PYTHON:-python}"
    return 0
  fi
  local hint="bash scripts/install_gpu.sh installs the GPU stack (verl 0.9.1, vLLM) into the current environment;"
  hint+=" bash scripts/setup_env.sh builds .venv, the CPU stack, enough for DRY_RUN=1 (docs/launch_scripts.md)"
  exgrpo_pick_python "$EXGRPO_REPO_ROOT" exgrpo "$hint" "$@"
}

# --- values ----------------------------------------------------------------------------------------------------

# exgrpo_require_var NAME HINT: NAME must be set; in a dry run an unset one gets a placeholder path.
exgrpo_require_var() {
  local name="$1" hint="$2"
  if [[ -n "${!name:-}" ]]; then return 0; fi
  if [[ "$EXGRPO_MODE" == launch ]]; then
    exgrpo_die "$name is not set: $hint"
  fi
  printf -v "$name" '%s' "/dry-run-placeholder/$name"
  EXGRPO_PLACEHOLDERS+=("$name")
  exgrpo_log "dry run: $name is not set, using the placeholder ${!name}"
}

# exgrpo_positive_int NAME: NAME holds an integer >= 1.
exgrpo_positive_int() {
  local name="$1"
  [[ "${!name}" =~ ^[1-9][0-9]*$ ]] || exgrpo_die "$name must be a positive integer, got '${!name}'"
}

# exgrpo_abspath PATH: the absolute, normalised path when PATH exists here (relative to the caller's directory);
# else unchanged (a Hub id such as Qwen/Qwen2.5-Math-7B, a URL, a hydra list, or a path created later).
exgrpo_abspath() {
  local p="$1"
  if [[ "$p" != *"://"* && "$p" != "["* && -e "$p" ]]; then
    p="$(cd "$(dirname "$p")" && pwd)/$(basename "$p")"
  fi
  printf '%s' "$p"
}

# exgrpo_hydra_value VALUE: VALUE as one hydra override value (quoted, so commas, '=' or spaces in a path are
# not read as hydra syntax); a hydra list "[...]" is passed as it is.
exgrpo_hydra_value() {
  local v="$1"
  if [[ "$v" == "["* ]]; then
    printf '%s' "$v"
  elif [[ "$v" == *"'"* ]]; then
    exgrpo_die "a path with a single quote cannot be passed to hydra: $v"
  else
    printf "'%s'" "$v"
  fi
}

# exgrpo_is_placeholder NAME: NAME was filled with a dry-run placeholder.
exgrpo_is_placeholder() {
  local n
  for n in "${EXGRPO_PLACEHOLDERS[@]}"; do [[ "$n" == "$1" ]] && return 0; done
  return 1
}

# exgrpo_resolve_ckpt_dir: CKPT_DIR absolute (default <repo>/checkpoints) and exported, so that the scripts a
# reproduction script starts write where it looks.
exgrpo_resolve_ckpt_dir() {
  CKPT_DIR="${CKPT_DIR:-$EXGRPO_REPO_ROOT/checkpoints}"
  [[ "$CKPT_DIR" == /* || "$CKPT_DIR" == *"://"* ]] || CKPT_DIR="$PWD/$CKPT_DIR"
  PROJECT_NAME="${PROJECT_NAME:-exgrpo}"
  export CKPT_DIR PROJECT_NAME
}

# exgrpo_run_dir EXPERIMENT: where that experiment's checkpoints go (trainer.default_local_dir).
exgrpo_run_dir() { printf '%s' "$CKPT_DIR/$PROJECT_NAME/$1"; }

# exgrpo_worker_env NAME...: each NAME that is set goes to every Ray worker of the job, through the job's
# runtime_env (call after exgrpo_prepare). Exporting it is not enough: the workers inherit the driver's environment
# only when verl's ray.init starts the cluster itself; on a cluster joined through RAY_ADDRESS (ray start beforehand,
# other nodes) they were started by another shell and never see it.
exgrpo_worker_env() {
  local name value
  for name in "$@"; do
    [[ "$name" =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || exgrpo_die "exgrpo_worker_env: not a variable name: $name"
    [[ -n "${!name+set}" ]] || continue
    value="${!name}"
    # quoted, so that hydra keeps it a string (Ray takes only strings) whatever it looks like
    [[ "$value" != *"'"* ]] || exgrpo_die "$name holds a single quote, which cannot be passed to hydra: $value"
    EXGRPO_ARGS+=("++ray_kwargs.ray_init.runtime_env.env_vars.$name='$value'")
  done
}

# --- checks that need the real machine -------------------------------------------------------------------------

# A local model whose context is shorter than prompt + response would have its responses silently cut by vLLM
# (verl sets max_model_len to max_position_embeddings).
exgrpo_check_context() {
  [[ "${CHECK_CONTEXT:-1}" == 1 && -f "$MODEL_PATH/config.json" ]] || return 0
  local need=$((EXGRPO_MAX_PROMPT_LENGTH + EXGRPO_MAX_RESPONSE_LENGTH)) have
  have="$("$PYTHON" -c 'import json, sys
c = json.load(open(sys.argv[1]))
print(c.get("max_position_embeddings") or c.get("text_config", {}).get("max_position_embeddings") or 0)' \
    "$MODEL_PATH/config.json")" || exgrpo_die "cannot read $MODEL_PATH/config.json"
  if ((have < need)); then
    exgrpo_die "$MODEL_PATH has max_position_embeddings=$have < $need (max prompt $EXGRPO_MAX_PROMPT_LENGTH + max" \
      "response $EXGRPO_MAX_RESPONSE_LENGTH tokens): vLLM would cut responses short. Use a long-context variant" \
      "(the released run used a 16k-context 'think' variant of the backbone) or set CHECK_CONTEXT=0."
  fi
}

# The released Qwen2.5-Math backbones are "think" variants whose chat template ends the generation prompt with
# "<think>\n"; with the stock template the model is not put inside a think block and the think gate scores
# differently from the release. Warn only: a user may have a reason.
exgrpo_check_think_template() {
  [[ "${EXGRPO_EXPECT_THINK_TEMPLATE:-0}" == 1 && -f "$MODEL_PATH/tokenizer_config.json" ]] || return 0
  if ! grep -q '<think>' "$MODEL_PATH/tokenizer_config.json" "$MODEL_PATH"/chat_template.* 2>/dev/null; then
    exgrpo_log "warning: the chat template of $MODEL_PATH does not open a <think> block; the released backbone's" \
      "template ends its generation prompt with '<|im_start|>assistant\n<think>\n' (docs/launch_scripts.md)"
  fi
}

# A Ray cluster with fewer GPUs than the run asks for makes verl wait for its placement groups forever.
exgrpo_check_ray_cluster() {
  [[ -n "${RAY_ADDRESS:-}" && "${CHECK_RAY:-1}" == 1 ]] || return 0
  local need=$((NNODES * N_GPUS_PER_NODE)) have
  have="$("$PYTHON" -c 'import os, ray
ray.init(address=os.environ["RAY_ADDRESS"], logging_level="ERROR", log_to_driver=False)
print(int(ray.cluster_resources().get("GPU", 0)))' 2>/dev/null | tail -n 1)" ||
    exgrpo_die "cannot connect to the Ray cluster at RAY_ADDRESS=$RAY_ADDRESS (is 'ray start --head' running?" \
      "check with: bash scripts/train/common.sh ray-status)"
  if ((have < need)); then
    exgrpo_die "the Ray cluster at RAY_ADDRESS=$RAY_ADDRESS has $have GPUs; the run needs NNODES x" \
      "N_GPUS_PER_NODE = $need. Start the missing workers (bash scripts/train/common.sh ray-worker HEAD_IP:6379)," \
      "or lower NNODES; CHECK_RAY=0 skips this check" \
      "(docs/troubleshooting.md#ray-placement-the-run-waits-for-gpus-for-ever)."
  fi
}

# --- the launch ------------------------------------------------------------------------------------------------

# exgrpo_prepare --experiment NAME --steps N|epochs:E --rollout-tp TP --model-hint TEXT [--think-gate true|false|none]
#                [--delayed-start TAU|none] [--prompt-style chat|llama_base|tir] [--think-template expected]
#                [--data openr1|wildchat_if]
# Resolves paths and cluster variables and fills EXGRPO_ARGS with the released hyperparameters (docs/algorithm.md §11).
# --steps epochs:E trains E passes over the data (trainer.total_epochs; verl counts the steps); --think-gate none and
# --delayed-start none leave those keys out (a reward model run: no math-verify reward, the continuous mode's own
# delayed start); --data picks the default TRAIN_FILE / VAL_FILE and how to make them (openr1: the math runs);
# --prompt-style llama_base and tir pick the files of that style (PROMPT_STYLE=... bash scripts/prepare_data.sh).
exgrpo_prepare() {
  local experiment="" steps="" tp="" hint="" think_gate=true tau=0.35 style=chat data=openr1
  EXGRPO_EXPECT_THINK_TEMPLATE=0
  while (($#)); do
    case "$1" in
      --experiment) experiment="$2" ;;
      --steps) steps="$2" ;;
      --rollout-tp) tp="$2" ;;
      --model-hint) hint="$2" ;;
      --think-gate) think_gate="$2" ;;
      --delayed-start) tau="$2" ;;
      --prompt-style) style="$2" ;;
      --think-template) [[ "$2" == expected ]] && EXGRPO_EXPECT_THINK_TEMPLATE=1 ;;
      --data) data="$2" ;;
      *) exgrpo_die "exgrpo_prepare: unknown option $1" ;;
    esac
    shift 2
  done
  [[ "$style" =~ ^(chat|llama_base|tir)$ ]] || exgrpo_die "exgrpo_prepare: --prompt-style chat|llama_base|tir"
  [[ "$data" == openr1 || "$data" == wildchat_if ]] || exgrpo_die "exgrpo_prepare: --data openr1|wildchat_if"
  [[ -n "$experiment" && -n "$steps" && -n "$tp" ]] ||
    exgrpo_die "exgrpo_prepare needs --experiment, --steps and --rollout-tp"

  EXPERIMENT_NAME="${EXPERIMENT_NAME:-$experiment}"
  N_GPUS_PER_NODE="${N_GPUS_PER_NODE:-8}"
  NNODES="${NNODES:-1}"
  ROLLOUT_TP="${ROLLOUT_TP:-$tp}"
  exgrpo_positive_int N_GPUS_PER_NODE
  exgrpo_positive_int NNODES
  exgrpo_positive_int ROLLOUT_TP
  CKPT_KEEP="${CKPT_KEEP:-2}"
  local keep="$CKPT_KEEP"
  if [[ "$CKPT_KEEP" == all ]]; then keep=null; else exgrpo_positive_int CKPT_KEEP; fi
  if ((ROLLOUT_TP > N_GPUS_PER_NODE || N_GPUS_PER_NODE % ROLLOUT_TP)); then
    exgrpo_die "ROLLOUT_TP=$ROLLOUT_TP must divide N_GPUS_PER_NODE=$N_GPUS_PER_NODE (whole vLLM replicas per node)"
  fi
  if ((NNODES > 1)) && [[ -z "${RAY_ADDRESS:-}" ]]; then
    if [[ "$EXGRPO_MODE" == launch ]]; then
      exgrpo_die "NNODES=$NNODES needs a running Ray cluster: 'bash scripts/train/common.sh ray-head' on the head" \
        "node, 'bash scripts/train/common.sh ray-worker HEAD_IP:6379' on every other node, then run this script" \
        "on the head node with RAY_ADDRESS=auto (docs/launch_scripts.md)"
    fi
    exgrpo_log "dry run: NNODES=$NNODES without RAY_ADDRESS (a launch would stop here)"
  fi

  exgrpo_require_var MODEL_PATH "$hint"
  # The default data paths (bash scripts/prepare_data.sh writes them; PROMPT_STYLE=llama_base for Llama base).
  local train_default=data/openr1/train.parquet val_default=data/valid/valid_id.parquet
  if [[ "$style" == llama_base ]]; then
    train_default=data/openr1/train_llama_base.parquet val_default=data/valid_llama_base/valid_id.parquet
  elif [[ "$style" == tir ]]; then
    train_default=data/openr1_tir/train.parquet val_default=data/valid_tir/valid_id.parquet
  fi
  local make="PROMPT_STYLE=$style bash scripts/prepare_data.sh (docs/launch_scripts.md)" what="the OpenR1-Math 46k"
  if [[ "$data" == wildchat_if ]]; then
    train_default=data/wildchat_if/train.parquet val_default=data/wildchat_if/val.parquet what="the WildChat-IF prompts"
    make="python -m data_preprocess.wildchat_if --input FILE_OR_HUB_ID --output $train_default --val-output"
    make+=" $val_default (docs/launch_scripts.md)"
  fi
  if [[ -z "${TRAIN_FILE:-}" && -f "$EXGRPO_REPO_ROOT/$train_default" ]]; then
    TRAIN_FILE="$EXGRPO_REPO_ROOT/$train_default"
  fi
  exgrpo_require_var TRAIN_FILE "point it at $what parquet (default $train_default), made with: $make"
  if [[ -z "${VAL_FILE:-}" && -f "$EXGRPO_REPO_ROOT/$val_default" ]]; then
    VAL_FILE="$EXGRPO_REPO_ROOT/$val_default"
  fi
  exgrpo_require_var VAL_FILE "point it at the in-training validation parquet (default $val_default), made with: $make"
  MODEL_PATH="$(exgrpo_abspath "$MODEL_PATH")"
  TRAIN_FILE="$(exgrpo_abspath "$TRAIN_FILE")"
  VAL_FILE="$(exgrpo_abspath "$VAL_FILE")"
  if [[ "$EXGRPO_MODE" == launch ]]; then
    local var
    for var in TRAIN_FILE VAL_FILE; do
      if [[ "${!var}" != "["* && "${!var}" != *"://"* && ! -f "${!var}" ]]; then
        exgrpo_die "$var=${!var} is not a file"
      fi
    done
    if [[ "$MODEL_PATH" == /* && ! -d "$MODEL_PATH" ]]; then exgrpo_die "MODEL_PATH=$MODEL_PATH is not a directory"; fi
  fi
  exgrpo_resolve_ckpt_dir
  local run_dir
  run_dir="$(exgrpo_run_dir "$EXPERIMENT_NAME")"

  # shellcheck disable=SC2016  # ${...} below are hydra interpolations, not shell expansions
  EXGRPO_ARGS=(
    # Dr.GRPO-style GRPO: advantage = reward - group mean, no std division, no KL (docs/algorithm.md §1, §7)
    algorithm.adv_estimator=grpo
    algorithm.norm_adv_by_std_in_grpo=false
    algorithm.use_kl_in_reward=false
    # data: B = 128 questions per step, prompts <= 1024 tokens, responses <= 8192 tokens
    "data.train_files=$(exgrpo_hydra_value "$TRAIN_FILE")"
    "data.val_files=$(exgrpo_hydra_value "$VAL_FILE")"
    data.train_batch_size=128
    "data.max_prompt_length=$EXGRPO_MAX_PROMPT_LENGTH"
    "data.max_response_length=$EXGRPO_MAX_RESPONSE_LENGTH"
    data.filter_overlong_prompts=true
    data.truncation=error
    # model: gradient checkpointing, remove-padding
    "actor_rollout_ref.model.path=$(exgrpo_hydra_value "$MODEL_PATH")"
    actor_rollout_ref.model.enable_gradient_checkpointing=true
    actor_rollout_ref.model.use_remove_padding=true
    # actor: lr 1e-6, mini-batch 64 questions (2 updates per step), entropy bonus 0.001, no KL loss,
    # dynamic batch size with 32768 tokens per GPU, token sums / L_max (docs/algorithm.md §8)
    actor_rollout_ref.actor.optim.lr=1e-6
    actor_rollout_ref.actor.ppo_mini_batch_size=64
    actor_rollout_ref.actor.entropy_coeff=0.001
    actor_rollout_ref.actor.use_kl_loss=false
    actor_rollout_ref.actor.use_dynamic_bsz=true
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=32768
    actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm
    'actor_rollout_ref.actor.loss_scale_factor=${data.max_response_length}'
    # rollout: vLLM, K = 8 samples at T = 1.0; validation at T = 0.6
    actor_rollout_ref.rollout.name=vllm
    actor_rollout_ref.rollout.n=8
    actor_rollout_ref.rollout.temperature=1.0
    actor_rollout_ref.rollout.top_p=1.0
    "actor_rollout_ref.rollout.tensor_model_parallel_size=$ROLLOUT_TP"
    # vLLM's share of the WHOLE card (vLLM 0.24), next to the FSDP actor's fp32 shards and AdamW state (~12 GiB
    # per GPU for 7-8B on 8 GPUs): 0.7 fits 80 GB cards with headroom (the release's 0.8 meant something else in
    # its older vLLM); the dry run estimates the sum (docs/launch_scripts.md, "GPU memory during generation")
    actor_rollout_ref.rollout.gpu_memory_utilization=0.7
    actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=true
    actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=32768
    actor_rollout_ref.rollout.val_kwargs.temperature=0.6
    actor_rollout_ref.rollout.val_kwargs.top_p=1.0
    actor_rollout_ref.rollout.val_kwargs.do_sample=true
  )
  # reward: math-verify on the text after </think>, 0 without it (the think gate): on for every backbone
  # trained with the LUFFY system prompt, which asks for "<think> ... </think>" and then the boxed answer
  # (instruct models included); off only for Llama-3.1-8B base, whose plain prompt has no think block (§10)
  [[ "$think_gate" == none ]] || EXGRPO_ARGS+=("++reward.custom_reward_function.reward_kwargs.think_gate=$think_gate")
  # ExGRPO: rho = 0.5, tau = 0.35 (delayed start), beta = 0.1 (policy shaping); the rest are the yaml's defaults
  EXGRPO_ARGS+=(exgrpo.replay_ratio=0.5)
  [[ "$tau" == none ]] || EXGRPO_ARGS+=("exgrpo.delayed_start_threshold=$tau")
  local steps_args=("trainer.total_training_steps=$steps")
  [[ "$steps" != epochs:* ]] || steps_args=(trainer.total_training_steps=null "trainer.total_epochs=${steps#epochs:}")
  # shellcheck disable=SC2016  # ${...} below are hydra interpolations, not shell expansions
  EXGRPO_ARGS+=(
    exgrpo.shaping=policy_shaping
    exgrpo.shaping_beta=0.1
    # trainer: steps, validation every 10, checkpoint every 50 (the last CKPT_KEEP kept), GPUs and nodes
    "${steps_args[@]}"
    trainer.test_freq=10
    trainer.save_freq=50
    "trainer.max_actor_ckpt_to_keep=$keep"
    "trainer.n_gpus_per_node=$N_GPUS_PER_NODE"
    "trainer.nnodes=$NNODES"
    "trainer.project_name=$(exgrpo_hydra_value "$PROJECT_NAME")"
    "trainer.experiment_name=$(exgrpo_hydra_value "$EXPERIMENT_NAME")"
    "trainer.default_local_dir=$(exgrpo_hydra_value "$run_dir")"
    "hydra.run.dir=$(exgrpo_hydra_value "$run_dir/hydra/\${now:%Y-%m-%d_%H-%M-%S}")"
  )
  if [[ "$style" == llama_base ]]; then
    # the prompt text is complete in the data: render it verbatim (no chat template, no system prompt)
    EXGRPO_ARGS+=("actor_rollout_ref.model.custom_chat_template=$(exgrpo_hydra_value "$EXGRPO_RAW_CHAT_TEMPLATE")")
  fi
  if [[ -n "${RAY_ADDRESS:-}" ]]; then
    EXGRPO_ARGS+=("++ray_kwargs.ray_init.address=$(exgrpo_hydra_value "$RAY_ADDRESS")")
  fi
  local mode="${MODE:-sync}" trainer="${TRAINER:-}"
  case "$mode" in
    sync) ;;
    colocate_async | separate_async)
      [[ "$trainer" != legacy ]] || exgrpo_die "MODE=$mode needs verl's v1 trainer: drop TRAINER=legacy (or set TRAINER=v1)"
      trainer=v1 ;;
    *) exgrpo_die "MODE=$mode: use sync (the default), colocate_async or separate_async (verl's v1 trainer modes)" ;;
  esac
  case "${trainer:-legacy}" in
    legacy) ;;
    v1) EXGRPO_ARGS+=(trainer.use_v1=true "trainer.v1.trainer_mode=$mode") ;;
    *) exgrpo_die "TRAINER=${TRAINER}: use legacy (verl's RayPPOTrainer, the default) or v1 (its v1 trainer, sync mode)" ;;
  esac
  [[ "$mode" != separate_async ]] || exgrpo_separate_async_args
}

# exgrpo_separate_async_args: MODE=separate_async. Each node's GPUs are split between the trainer and verl's
# standalone rollout (ROLLOUT_GPUS_PER_NODE, default half of N_GPUS_PER_NODE, on each of the NNODES nodes); the weights
# reach the rollout once a step through a checkpoint engine between the two (CKPT_ENGINE, default nccl); a step is
# PARAMETER_SYNC_STEP local updates (default 2) of train_batch_size / PARAMETER_SYNC_STEP questions each, one
# optimizer step each: with the default, the release's two updates of 64 questions per 128-question step.
exgrpo_separate_async_args() {
  PARAMETER_SYNC_STEP="${PARAMETER_SYNC_STEP:-2}"
  ROLLOUT_GPUS_PER_NODE="${ROLLOUT_GPUS_PER_NODE:-$((N_GPUS_PER_NODE / 2))}"
  exgrpo_positive_int PARAMETER_SYNC_STEP
  exgrpo_positive_int ROLLOUT_GPUS_PER_NODE
  local sync_steps="$PARAMETER_SYNC_STEP" rollout_gpus="$ROLLOUT_GPUS_PER_NODE"
  ((128 % sync_steps == 0)) || exgrpo_die "PARAMETER_SYNC_STEP=$sync_steps must divide the 128 questions of a step"
  ((rollout_gpus < N_GPUS_PER_NODE)) ||
    exgrpo_die "ROLLOUT_GPUS_PER_NODE=$rollout_gpus leaves no GPU of the $N_GPUS_PER_NODE per node to the trainer"
  ((rollout_gpus % ROLLOUT_TP == 0)) ||
    exgrpo_die "ROLLOUT_TP=$ROLLOUT_TP must divide ROLLOUT_GPUS_PER_NODE=$rollout_gpus (whole vLLM replicas)"
  EXGRPO_ARGS+=(
    "trainer.n_gpus_per_node=$((N_GPUS_PER_NODE - rollout_gpus))"
    "actor_rollout_ref.rollout.nnodes=$NNODES"
    "actor_rollout_ref.rollout.n_gpus_per_node=$rollout_gpus"
    "actor_rollout_ref.rollout.checkpoint_engine.backend=${CKPT_ENGINE:-nccl}"
    "trainer.v1.separate_async.parameter_sync_step=$sync_steps"
    "actor_rollout_ref.actor.ppo_mini_batch_size=$((128 / sync_steps))"
  )
}

# exgrpo_one_gpu_args: what a run on one card adds to the 8-GPU run it shrinks: the stage watchdog's deadlines of
# the GPU-bound stages x8 (each does the 8-GPU run's work on one card). Called after exgrpo_prepare.
exgrpo_one_gpu_args() {
  EXGRPO_ARGS+=(
    stage_deadlines.generate_s=28800
    stage_deadlines.old_log_prob_s=14400
    stage_deadlines.update_s=28800
    stage_deadlines.validate_s=57600
  )
}

# exgrpo_lora_args RANK ALPHA LR: a LoRA adapter on verl's FSDP actor (these keys; the model.lora.{rank,alpha,...}
# block is Megatron's) on every linear layer, served by vLLM as a LoRA request (lora.merge=false), the base weights
# in bf16, vLLM loading them from safetensors and taking the adapter layer by layer. Called after exgrpo_prepare.
exgrpo_lora_args() {
  EXGRPO_ARGS+=(
    "actor_rollout_ref.model.lora_rank=$1"
    "actor_rollout_ref.model.lora_alpha=$2"
    actor_rollout_ref.model.target_modules=all-linear
    actor_rollout_ref.model.lora.merge=false
    "actor_rollout_ref.actor.optim.lr=$3"
    actor_rollout_ref.actor.fsdp_config.model_dtype=bf16
    actor_rollout_ref.rollout.load_format=safetensors
    actor_rollout_ref.rollout.layered_summon=true
  )
}

# exgrpo_launch [extra hydra overrides]: run (or dry-run, or print) the entry point with EXGRPO_ARGS + extras.
exgrpo_launch() {
  local args=("${EXGRPO_ARGS[@]}" "$@") a
  ((${#EXGRPO_ARGS[@]})) || exgrpo_die "exgrpo_launch before exgrpo_prepare"
  for a in "${args[@]}"; do
    [[ "$a" != *$'\n'* ]] || exgrpo_die "a hydra override contains a newline: ${a%%$'\n'*}..."
  done
  cd "$EXGRPO_REPO_ROOT"
  export PYTHONPATH="$EXGRPO_REPO_ROOT${PYTHONPATH:+:$PYTHONPATH}"
  case "$EXGRPO_MODE" in
    check) exgrpo_use_python omegaconf hydra verl ;;
    launch) exgrpo_use_python omegaconf hydra verl ray vllm ;;
  esac
  case "$EXGRPO_MODE" in
    print)
      printf '%s\n' "$EXGRPO_PRINT_BEGIN" "${args[@]}" "$EXGRPO_PRINT_END"
      ;;
    check)
      # the launch's own checks, as far as they can run here (the model's context is checked by the dry run)
      exgrpo_check_think_template
      if [[ -n "${RAY_ADDRESS:-}" && "${CHECK_RAY:-1}" == 1 ]]; then
        exgrpo_log "dry run, not checked: the GPUs of the Ray cluster at RAY_ADDRESS=$RAY_ADDRESS (a launch asks" \
          "the cluster first; CHECK_RAY=0 skips that)"
      fi
      local opts=()
      [[ "${DRY_RUN_QUIET:-0}" != 1 ]] || opts+=(--quiet)
      # Every path given: each must exist, as in a launch. With a placeholder (CI, no models) the dry run checks the
      # paths that exist here and lists the checks it could not run.
      ((${#EXGRPO_PLACEHOLDERS[@]})) || opts+=(--check-paths)
      exgrpo_log "dry run: $PYTHON -m recipe.exgrpo.dry_run ${opts[*]} -- <${#args[@]} overrides>"
      exec "$PYTHON" -m recipe.exgrpo.dry_run "${opts[@]}" -- "${args[@]}"
      ;;
    launch)
      exgrpo_check_context
      exgrpo_check_think_template
      exgrpo_check_ray_cluster
      if [[ "${PREFLIGHT:-1}" == 1 ]]; then
        exgrpo_log "pre-flight: composing and validating the config (PREFLIGHT=0 skips this)"
        "$PYTHON" -m recipe.exgrpo.dry_run --quiet --check-paths -- "${args[@]}" ||
          exgrpo_die "the pre-flight check failed (messages above); nothing was launched"
      fi
      [[ "$CKPT_DIR" == *"://"* ]] || mkdir -p "$(exgrpo_run_dir "$EXPERIMENT_NAME")"
      exgrpo_log "launching $EXPERIMENT_NAME on $NNODES node(s) x $N_GPUS_PER_NODE GPUs"
      exec "$PYTHON" -m recipe.exgrpo.main_exgrpo "${args[@]}"
      ;;
  esac
}

# --- reproduction: train -> merge -> evaluate -> table ----------------------------------------------------------

# exgrpo_run_or_show CMD...: run CMD, or in a dry run only show it (on stderr, so DRY_RUN=print output stays clean).
exgrpo_run_or_show() {
  local shown
  shown="$(printf '%q ' "$@")"
  if [[ "$EXGRPO_MODE" == launch ]]; then
    exgrpo_log "run: ${shown% }"
    "$@"
  else
    exgrpo_log "dry run, would run: ${shown% }"
  fi
}

# exgrpo_check_eval_data: the evaluation suites' data files exist (the eval scripts' own check, EVAL_CHECK_ONLY=1),
# so that a reproduction does not stop after 700 training steps for a missing parquet. All three OOD files are
# required (ALLOW_PARTIAL_EVAL=1: missing ones are skipped, the OOD Avg is then partial). A dry run only warns.
exgrpo_check_eval_data() {
  local suite ok=1 require=1
  [[ "${ALLOW_PARTIAL_EVAL:-0}" == 1 ]] && require=0
  for suite in id ood; do
    if ! EVAL_CHECK_ONLY=1 OOD_REQUIRE_ALL="$require" bash "$EXGRPO_REPO_ROOT/scripts/eval/eval_$suite.sh"; then
      ok=0
    fi
  done
  if ((ok == 0)); then
    if [[ "$EXGRPO_MODE" == launch ]]; then
      exgrpo_die "the evaluation data is missing (above): write it with 'bash scripts/prepare_data.sh' (DATA_DIR" \
        "to use another directory; ALLOW_PARTIAL_EVAL=1 to evaluate without missing OOD sets, STAGES=train to" \
        "train only)"
    fi
    exgrpo_log "dry run: the evaluation data is missing (a launch would stop here, before training)"
  fi
}

# exgrpo_latest_hf EXPERIMENT: the Hugging Face directory of the experiment's latest checkpoint, merged from the
# FSDP shards with verl's model merger on first use. Prints the directory.
exgrpo_latest_hf() {
  local run_dir step actor target
  run_dir="$(exgrpo_run_dir "$1")"
  if [[ "$EXGRPO_MODE" != launch ]]; then
    exgrpo_log "dry run, would run: $PYTHON -m verl.model_merger merge --backend fsdp" \
      "--local_dir $run_dir/global_step_<latest>/actor --target_dir $run_dir/global_step_<latest>/merged_hf"
    printf '%s' "$run_dir/global_step_LATEST/merged_hf"
    return 0
  fi
  [[ -f "$run_dir/latest_checkpointed_iteration.txt" ]] ||
    exgrpo_die "no checkpoint in $run_dir (latest_checkpointed_iteration.txt missing): did training of $1 finish?"
  step="$(tr -d '[:space:]' <"$run_dir/latest_checkpointed_iteration.txt")"
  actor="$run_dir/global_step_$step/actor"
  target="$run_dir/global_step_$step/merged_hf"
  [[ -d "$actor" ]] || exgrpo_die "$actor does not exist"
  if ! compgen -G "$target/*.safetensors" >/dev/null; then
    exgrpo_log "merging $actor -> $target"
    "$PYTHON" -m verl.model_merger merge --backend fsdp --local_dir "$actor" --target_dir "$target" >&2 ||
      exgrpo_die "verl.model_merger failed for $actor"
  fi
  printf '%s' "$target"
}

# exgrpo_reproduce REFERENCE OUT_DIR RUN... [-- EXTRA_OVERRIDES...]
#   RUN = "label|train-script|experiment|model-path-var" (an empty model-path-var means MODEL_PATH); the extra
#   hydra overrides go to every training run. STAGES (default train,eval,table) picks the stages. The evaluation
#   runs on EVAL_N_GPUS GPUs (default N_GPUS_PER_NODE, 8), one vLLM replica per EVAL_TP GPUs (default 1).
exgrpo_reproduce() {
  local reference="$1" out_dir="$2" spec label script experiment model_var results=() specs=()
  local eval_gpus="${EVAL_N_GPUS:-${N_GPUS_PER_NODE:-8}}" eval_tp="${EVAL_TP:-1}"
  shift 2
  while (($#)) && [[ "$1" != -- ]]; do
    specs+=("$1")
    shift
  done
  (($#)) && shift # the "--"; what is left are the extra overrides
  # the merge (verl) and the evaluation (vLLM) run with this Python; a dry run only shows them
  if [[ "$EXGRPO_MODE" == launch ]]; then
    exgrpo_use_python verl vllm math_verify pyarrow
  else
    EXGRPO_PICK_SOFT=1 exgrpo_use_python verl
  fi
  local stages=",${STAGES:-train,eval,table}," stage
  for stage in ${stages//,/ }; do
    [[ "$stage" =~ ^(train|eval|table)$ ]] || exgrpo_die "STAGES=$STAGES: the stages are train, eval and table"
  done
  exgrpo_resolve_ckpt_dir
  if [[ "$stages" == *,eval,* ]]; then exgrpo_check_eval_data; fi
  for spec in "${specs[@]}"; do
    IFS='|' read -r label script experiment model_var <<<"$spec"
    model_var="${model_var:-MODEL_PATH}"
    if [[ "$stages" == *,train,* ]]; then
      exgrpo_log "=== train $label: $script (EXPERIMENT_NAME=$experiment)"
      MODEL_PATH="${!model_var:-}" EXPERIMENT_NAME="$experiment" bash "$EXGRPO_TRAIN_DIR/$script" "$@" ||
        exgrpo_die "training $label failed ($script)"
    fi
    if [[ "$stages" == *,eval,* ]]; then
      local hf suite
      hf="$(exgrpo_latest_hf "$experiment")"
      for suite in id ood; do
        exgrpo_run_or_show env MODEL_PATH="$hf" LABEL="$label" OUT_DIR="$out_dir/eval/$experiment/$suite" \
          N_GPUS="$eval_gpus" TP="$eval_tp" GRADING="${EVAL_GRADING:-paper}" THINK_GATE="${EVAL_THINK_GATE:-1}" \
          OOD_REQUIRE_ALL="$((1 - ${ALLOW_PARTIAL_EVAL:-0}))" REFERENCE="$reference" PYTHON="$PYTHON" \
          bash "$EXGRPO_REPO_ROOT/scripts/eval/eval_$suite.sh"
      done
    fi
    results+=("$out_dir/eval/$experiment/id/results.json" "$out_dir/eval/$experiment/ood/results.json")
  done
  if [[ "$stages" == *,table,* ]]; then
    local existing=() f
    for f in "${results[@]}"; do
      if [[ "$EXGRPO_MODE" != launch || -f "$f" ]]; then existing+=("$f"); else exgrpo_log "missing $f (skipped)"; fi
    done
    ((${#existing[@]})) || exgrpo_die "no evaluation results under $out_dir/eval: run the eval stage first"
    (cd "$EXGRPO_REPO_ROOT" && exgrpo_run_or_show "$PYTHON" -m exgrpo.eval report "${existing[@]}" \
      --reference "$reference" --out "$out_dir/table")
  fi
}

# --- Ray cluster helpers (bash scripts/train/common.sh COMMAND) -------------------------------------------------

exgrpo_ray() {
  # The ray CLI of $PYTHON's environment; PYTHONPATH makes the recipe importable in every Ray worker process.
  PYTHONPATH="$EXGRPO_REPO_ROOT${PYTHONPATH:+:$PYTHONPATH}" exgrpo_run_or_show "$PYTHON" -m ray.scripts.scripts "$@"
}

# exgrpo_ray_token_file: the token file Ray reads when RAY_AUTH_TOKEN is unset.
exgrpo_ray_token_file() { echo "${RAY_AUTH_TOKEN_PATH:-$HOME/.ray/auth_token}"; }

# exgrpo_ray_auth head|worker|client: Ray's token authentication, on unless RAY_AUTH_MODE says otherwise. Every node
# and every driver must present the cluster's token (RAY_AUTH_TOKEN, or the file RAY_AUTH_TOKEN_PATH, default
# ~/.ray/auth_token); GCS and dashboard refuse the rest. The head creates the token file when there is none.
exgrpo_ray_auth() {
  local role="$1" file
  file="$(exgrpo_ray_token_file)"
  if [[ "$role" == client ]]; then
    # ray status / ray.init(address=HOST:PORT) enable token mode only when told; tell them when a token is here.
    if [[ -z "${RAY_AUTH_MODE:-}" && (-n "${RAY_AUTH_TOKEN:-}" || -s "$file") ]]; then export RAY_AUTH_MODE=token; fi
    return 0
  fi
  export RAY_AUTH_MODE="${RAY_AUTH_MODE:-token}"
  if [[ "$RAY_AUTH_MODE" != token ]]; then
    exgrpo_log "warning: RAY_AUTH_MODE=$RAY_AUTH_MODE: the Ray cluster will accept anyone who reaches its ports" \
      "and run their code; unset it to keep token authentication on"
    return 0
  fi
  [[ -n "${RAY_AUTH_TOKEN:-}" || -s "$file" ]] && return 0
  if [[ "$role" == worker ]]; then
    local msg="no Ray auth token on this node ($file is missing and RAY_AUTH_TOKEN is unset). The head node's"
    msg+=" ray-head created its token file: put the same file here (a shared home directory, or scp it, chmod 600),"
    msg+=" or set RAY_AUTH_TOKEN / RAY_AUTH_TOKEN_PATH; docs/launch_scripts.md"
    [[ "$EXGRPO_MODE" == launch ]] || {
      exgrpo_log "dry run: $msg"
      return 0
    }
    exgrpo_die "$msg"
  fi
  if [[ "$EXGRPO_MODE" != launch ]]; then
    exgrpo_log "dry run, would create the Ray auth token file $file"
    return 0
  fi
  (umask 077 && mkdir -p "$(dirname "$file")" && "$PYTHON" -c '
import os, secrets, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
os.write(fd, secrets.token_hex(32).encode())
os.close(fd)
os.chmod(sys.argv[1], 0o600)' "$file") || exgrpo_die "could not create the Ray auth token file $file"
  exgrpo_log "created the Ray auth token $file (mode 600): every worker node and driver needs this token"
}

exgrpo_ray_cli() {
  local cmd="${1:-help}"
  (($#)) && shift
  N_GPUS_PER_NODE="${N_GPUS_PER_NODE:-8}"
  local port="${RAY_PORT:-6379}"
  if [[ "$cmd" == ray-* ]]; then
    if [[ "$EXGRPO_MODE" == launch ]]; then exgrpo_use_python ray; else EXGRPO_PICK_SOFT=1 exgrpo_use_python ray; fi
  fi
  case "$cmd" in
    ray-head)
      # The dashboard serves Ray's Jobs API, which runs whatever code it is sent: loopback only unless asked.
      local dashboard_host="${RAY_DASHBOARD_HOST:-127.0.0.1}"
      if [[ "$dashboard_host" != 127.0.0.1 && "$dashboard_host" != localhost && "$dashboard_host" != ::1 ]]; then
        exgrpo_log "warning: RAY_DASHBOARD_HOST=$dashboard_host: the dashboard and its Jobs API listen beyond this" \
          "machine (they still require the token when RAY_AUTH_MODE=token); an SSH tunnel is safer"
      fi
      exgrpo_ray_auth head
      exgrpo_ray start --head --port="$port" --num-gpus="$N_GPUS_PER_NODE" --dashboard-host="$dashboard_host" "$@"
      local ip started="head started. On every other node"
      ip="$(hostname -I 2>/dev/null | awk '{print $1}')"
      [[ "$EXGRPO_MODE" == launch ]] || started="dry run: nothing was started. After a real ray-head, on every other node"
      exgrpo_log "$started (with the same token, see docs/launch_scripts.md):"
      exgrpo_log "  bash scripts/train/common.sh ray-worker ${ip:-HEAD_IP}:$port"
      exgrpo_log "then here:  NNODES=<nodes> RAY_ADDRESS=auto bash scripts/train/<script>.sh"
      ;;
    ray-worker)
      (($#)) || exgrpo_die "usage: bash scripts/train/common.sh ray-worker HEAD_IP:PORT [ray start options]"
      local address="$1"
      shift
      exgrpo_ray_auth worker
      exgrpo_ray start --address="$address" --num-gpus="$N_GPUS_PER_NODE" "$@"
      ;;
    ray-wait)
      # Wait until the cluster has N GPUs (default NNODES x N_GPUS_PER_NODE): for batch schedulers that start the
      # workers and the launch at the same time.
      local want="${1:-$((${NNODES:-1} * N_GPUS_PER_NODE))}" timeout="${RAY_WAIT_TIMEOUT:-900}"
      if [[ "$EXGRPO_MODE" != launch ]]; then
        exgrpo_log "dry run, would wait for $want GPUs"
        return 0
      fi
      exgrpo_ray_auth client
      RAY_ADDRESS="${RAY_ADDRESS:-auto}" "$PYTHON" - "$want" "$timeout" <<'EOF' ||
import os, sys, time
import ray
want, timeout = int(sys.argv[1]), float(sys.argv[2])
ray.init(address=os.environ["RAY_ADDRESS"], logging_level="ERROR", log_to_driver=False)
deadline = time.time() + timeout
while True:
    have = int(ray.cluster_resources().get("GPU", 0))
    print(f"[exgrpo] Ray cluster: {have}/{want} GPUs", file=sys.stderr)
    if have >= want:
        sys.exit(0)
    if time.time() > deadline:
        sys.exit(1)
    time.sleep(10)
EOF
        exgrpo_die "the Ray cluster did not reach $want GPUs within ${timeout} s"
      ;;
    ray-status)
      exgrpo_ray_auth client
      if [[ "$EXGRPO_MODE" != launch ]]; then
        exgrpo_ray status "$@"
        return 0
      fi
      # Ray answers "no cluster" with a traceback: keep its last line and say what to do
      local out last
      if ! out="$(PYTHONPATH="$EXGRPO_REPO_ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m ray.scripts.scripts status \
        "$@" 2>&1)"; then
        last="$(grep -v '^[[:space:]]*$' <<<"$out" | tail -n 1)"
        exgrpo_die "ray status failed: ${last%.}. Is a cluster running? Start" \
          "one with 'bash scripts/train/common.sh ray-head' (and RAY_ADDRESS=HOST:PORT for another node's)"
      fi
      printf '%s\n' "$out"
      ;;
    ray-stop) exgrpo_ray stop "$@" ;;
    *)
      echo "usage: bash scripts/train/common.sh COMMAND" >&2
      echo "  ray-head | ray-worker HEAD_IP:PORT | ray-wait [N_GPUS] | ray-status | ray-stop" >&2
      echo "  (N_GPUS_PER_NODE, NNODES, RAY_PORT, PYTHON, DRY_RUN as in the launch scripts; RAY_DASHBOARD_HOST," >&2
      echo "   RAY_AUTH_MODE, RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH: docs/launch_scripts.md)" >&2
      [[ "$cmd" == help ]] || exit 2
      ;;
  esac
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  set -euo pipefail
  exgrpo_ray_cli "$@"
fi
