"""Checker 7 of the dry run: the checks a launch's pre-flight makes on the machine's files. The model directory and
the data files exist, the model's context holds prompt + response (``max_position_embeddings`` of its config.json,
as the launch scripts' ``CHECK_CONTEXT``), and the data's prompts suit the chat template.

With ``--check-paths`` (a launch's pre-flight, or a dry run given every path) a path missing here is a problem.
Without it the dry run may run elsewhere than the launch (a laptop before the cluster): what it can read is checked
all the same, and each check it cannot run here is listed as "not checked", with the reason, so an OK never hides
one."""

from __future__ import annotations

import json
import os
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

#: Where the launch scripts point an unset MODEL_PATH / TRAIN_FILE / VAL_FILE in a dry run (scripts/train/common.sh).
PLACEHOLDER_PREFIX = "/dry-run-placeholder/"
#: 0 skips the context check, here as in the launch scripts.
CHECK_CONTEXT_ENV = "CHECK_CONTEXT"


def _placeholder(path: str) -> str | None:
    """The variable a placeholder path stands for (``MODEL_PATH``), or None."""
    return path[len(PLACEHOLDER_PREFIX) :] if path.startswith(PLACEHOLDER_PREFIX) else None


def check_paths(config: DictConfig) -> list[str]:
    """The problems of ``launch_path_checks`` with every path required to exist (``--check-paths``)."""
    return launch_path_checks(config, strict=True)[0]


def launch_path_checks(config: DictConfig, strict: bool) -> tuple[list[str], list[str]]:
    """(problems, not checked) of the model and data paths (skips remote URLs). ``strict``: a local path missing
    here is a problem; otherwise it is a check not run here."""
    problems: list[str] = []
    not_checked: list[str] = []
    model = str(config.actor_rollout_ref.model.path)
    key = "actor_rollout_ref.model.path"
    var = _placeholder(model)
    local_model = model.startswith(("/", ".", "~")) or os.path.exists(model)
    what = "its directory and its context length (max_position_embeddings >= prompt + response tokens)"
    if local_model and not os.path.isdir(os.path.expanduser(model)):
        if strict:
            problems.append(f"{key}={model} is not a directory")
        elif var:
            not_checked.append(f"the model: {var} is not set (a placeholder stands in): {what}")
        else:
            not_checked.append(f"the model: {model} does not exist on this machine: {what}")
    elif local_model:
        p, n = check_context(config, os.path.expanduser(model))
        problems += p
        not_checked += n
    else:
        not_checked.append(f"the context length of {model}: not a directory here (a Hub id is read on the cluster)")
    for key in ("data.train_files", "data.val_files"):
        value = OmegaConf.select(config, key)
        files = list(value) if isinstance(value, (list, ListConfig)) else [value]
        for f in files:
            f = str(f)
            if "://" in f:
                continue
            if os.path.isfile(os.path.expanduser(f)):
                problems += check_prompt_style(key, os.path.expanduser(f), config)
            elif strict:
                problems.append(f"{key}: {f} is not a file")
            elif _placeholder(f):
                var = _placeholder(f)
                not_checked.append(f"{key}: {var} is not set (a placeholder stands in): the file, its prompts")
            else:
                not_checked.append(f"{key}: {f} does not exist on this machine: the file, its prompts")
    lora_p, lora_n = lora_path_checks(config, strict, local_model and os.path.isdir(os.path.expanduser(model)))
    return problems + lora_p, not_checked + lora_n


def lora_path_checks(config: DictConfig, strict: bool, model_here: bool) -> tuple[list[str], list[str]]:
    """(problems, not checked) of a LoRA run's files: the adapter of ``lora_adapter_path`` (its rank and alpha are
    checked against the config's at start-up when it is here) and the model whose layers the target modules must
    match (``recipe/exgrpo/lora.py``)."""
    from recipe.exgrpo.lora import ADAPTER_PATH_KEY, TARGETS_KEY, LoraSettings

    lora = LoraSettings.of(config)
    if not lora.enabled:
        return [], []
    problems, not_checked = [], []
    path = lora.adapter_path
    if path and "://" not in str(path) and not os.path.isdir(os.path.expanduser(str(path))):
        if strict:
            problems.append(f"{ADAPTER_PATH_KEY}={path} is not a directory")
        else:
            not_checked.append(f"{ADAPTER_PATH_KEY}: {path} does not exist on this machine: its rank and alpha")
    elif path and "://" in str(path):
        not_checked.append(f"{ADAPTER_PATH_KEY}: {path} is remote: its rank and alpha")
    if not path and not model_here:
        not_checked.append(f"{TARGETS_KEY}: the model is not on this machine: the layers the target modules match")
    return problems, not_checked


def check_context(config: DictConfig, model_dir: str) -> tuple[list[str], list[str]]:
    """A model whose context is shorter than prompt + response would have its responses cut (verl sets vLLM's
    ``max_model_len`` from it): the launch scripts refuse it, and so does the dry run (``CHECK_CONTEXT=0`` skips)."""
    if os.environ.get(CHECK_CONTEXT_ENV, "1") == "0":
        return [], [f"the context length of {model_dir} ({CHECK_CONTEXT_ENV}=0)"]
    path = os.path.join(model_dir, "config.json")
    try:
        with open(path, encoding="utf-8") as f:
            cfg = json.load(f)
    except FileNotFoundError:
        return [], [f"the context length of {model_dir}: it has no config.json"]
    except (OSError, ValueError) as e:
        return [f"actor_rollout_ref.model.path: cannot read {path} ({type(e).__name__}: {e})"], []
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else {}
    have = cfg.get("max_position_embeddings") or text.get("max_position_embeddings")
    if not isinstance(have, int):
        return [], [f"the context length of {model_dir}: its config.json has no max_position_embeddings"]
    prompt, response = int(config.data.max_prompt_length), int(config.data.max_response_length)
    if have < prompt + response:
        return [
            f"actor_rollout_ref.model.path={model_dir} has max_position_embeddings={have} < {prompt + response} "
            f"(data.max_prompt_length {prompt} + data.max_response_length {response} tokens): vLLM would cut "
            "responses short. Use a long-context variant (the released run used a 16k-context 'think' variant of "
            f"the backbone) or set {CHECK_CONTEXT_ENV}=0."
        ], []
    return [], []


def _first_prompt(path: str) -> list[dict[str, Any]] | None:
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
        if "prompt" not in pf.schema_arrow.names or pf.metadata.num_rows == 0:
            return None
        value = pf.read_row_group(0, columns=["prompt"]).column("prompt")[0].as_py()
    except Exception:  # not parquet, or unreadable: verl reports it with its own message
        return None
    return value if isinstance(value, list) else None


def check_prompt_style(key: str, path: str, config: DictConfig) -> list[str]:
    """The Llama-3.1-8B base run renders the data's messages verbatim (``custom_chat_template`` =
    ``exgrpo.prompts.RAW_CHAT_TEMPLATE``): its files must hold the complete base-model prompt and no system
    message (made with ``--prompt-style llama_base``); and such files under a real chat template would have
    their "User: ... Answer:" text wrapped in chat markup. Either mismatch trains on other prompts than the
    paper's, silently, so it stops the launch. Only the first row of each file is read."""
    from exgrpo.prompts import RAW_CHAT_TEMPLATE

    messages = _first_prompt(path)
    if not messages:
        return []
    raw = OmegaConf.select(config, "actor_rollout_ref.model.custom_chat_template") == RAW_CHAT_TEMPLATE
    roles = [m.get("role") for m in messages if isinstance(m, dict)]
    content = str(messages[-1].get("content", "")) if isinstance(messages[-1], dict) else ""
    llama_style = roles == ["user"] and content.startswith("User: ") and content.endswith("step by step.\n")
    if raw and not llama_style:
        return [
            f"{key}: {path} holds chat prompts (roles {roles}), but actor_rollout_ref.model.custom_chat_template "
            "renders the Llama-3.1-8B base prompt verbatim: make the file with --prompt-style llama_base "
            "(PROMPT_STYLE=llama_base bash scripts/prepare_data.sh)"
        ]
    if llama_style and not raw:
        return [
            f"{key}: {path} holds Llama-3.1-8B base prompts (--prompt-style llama_base), but the model's chat "
            "template would wrap them; use the default --prompt-style chat for this backbone"
        ]
    return []
