"""Test-only assets for multi-turn runs: the tiny warmed-up model, made to call a tool in about a third of its turns.

The model was never taught a tool-call format, and at 157k parameters it would not write the ~50 bytes of a hermes
tool call by chance. So the tokenizer gets one added token whose text *is* a whole call of the test tool,
``<tool_call>{"name": "lookup", "arguments": {}}</tool_call>`` (:data:`TOOL_CALL`), and the model one more row in its
embedding and output layers, copied from the token ``<`` (the first byte of the ``</think>`` most answers start
with). Sampling then opens a turn with the call about a third of the time (the two tokens share ``<``'s probability);
after it the model goes on as after ``<`` (``/think>\\boxed{..}<|im_end|>``), so the turn ends. Everything else is
verl's own: the tool agent loop, the hermes parser (it decodes the turn and reads the call), the function-tool
loader (:data:`TOOL_FILE`), the Qwen continuous-token builder that appends the tool's answer as context tokens
(mask 0) between the model's turns.

``build_tool_assets(base, out)`` writes an asset directory in the layout of ``recipe.exgrpo.harness.assets.Assets``
(``model/``, ``data/train.parquet``, ``data/val.parquet``; every row's ``agent_name`` is ``tool_agent``).
"""

from __future__ import annotations

import shutil
from pathlib import Path

E2E_DIR = Path(__file__).resolve().parent
TOOL_FILE = E2E_DIR / "lookup_tool.py"
TOOL_REWARD = E2E_DIR / "tool_call_reward.py"
TOOL_CALL = '<tool_call>{"name": "lookup", "arguments": {}}</tool_call>'
#: the byte whose embedding and output rows the call token copies
CALL_LIKE = "<"


def rig_model(base_model: Path, out: Path) -> int:
    """Copy the model at ``base_model`` to ``out`` with the call token added; returns its id."""
    import torch
    from tokenizers import AddedToken
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(base_model)
    model = AutoModelForCausalLM.from_pretrained(base_model, dtype=torch.float32)
    tok.add_special_tokens(
        {"additional_special_tokens": [AddedToken(TOOL_CALL, special=True, normalized=False)]},
        replace_extra_special_tokens=False,
    )
    call = tok.convert_tokens_to_ids(TOOL_CALL)
    (like,) = tok.encode(CALL_LIKE, add_special_tokens=False)
    model.resize_token_embeddings(len(tok), mean_resizing=False)
    with torch.no_grad():
        model.get_input_embeddings().weight[call] = model.get_input_embeddings().weight[like]
        model.get_output_embeddings().weight[call] = model.get_output_embeddings().weight[like]
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    if (base_model / "generation_config.json").exists():
        shutil.copy(base_model / "generation_config.json", out / "generation_config.json")
    return call


def tool_data(src: Path, dst: Path) -> None:
    """``src`` with every row served by verl's tool agent loop (``agent_name=tool_agent``)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(src)
    table = table.append_column("agent_name", pa.array(["tool_agent"] * table.num_rows, pa.string()))
    dst.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, dst)


def build_tool_assets(base, out: Path):
    """The assets of ``base`` (``recipe.exgrpo.harness.assets.Assets``) for a multi-turn run, written under ``out``."""
    from recipe.exgrpo.harness.assets import Assets

    assets = Assets(Path(out))
    rig_model(Path(base.model_path), assets.model_path)
    tool_data(Path(base.train_file), assets.train_file)
    tool_data(Path(base.val_file), assets.val_file)
    return assets


def multi_turn_overrides() -> list[str]:
    """The hydra overrides of a multi-turn run with the test tool (one tool answer per exchange, at most)."""
    mt = "actor_rollout_ref.rollout.multi_turn"
    return [
        f"{mt}.enable=True",
        f"{mt}.format=hermes",
        f"{mt}.function_tool_path={TOOL_FILE}",
        # one tool answer per exchange: a second call in the next turn is never run (its exchange ends unanswered,
        # which the recipe must not store)
        f"{mt}.max_user_turns=1",
        f"{mt}.max_assistant_turns=3",
    ]
