"""A reward function that scores each response with the reward model verl serves, through the model's router.

For a discriminative reward model in its own resource pool (``reward.reward_model.enable_resource_pool=true``: the
paper's reward-model run with ``RM_GPUS_PER_NODE > 0``). There verl 0.9.1's agent loop scores each response as it is
generated and reads the result's ``reward_extra_info``, which verl's own scoring of a discriminative model does not
return, so every step would fail; a reward function is called by verl's reward manager, which returns it. verl
hands a reward function the model's router address and tokenizer, and this one asks the model exactly as verl's own
scoring does (``RewardLoopWorker._preprocess_reward_inputs`` and ``compute_score_disrm`` in
``verl/experimental/reward_loop/reward_loop.py``):

1. the conversation of the prompt (``extra_info["raw_prompt"]``, below) plus the response as the assistant's turn,
   rendered with the reward model's own chat template, its BOS token dropped (vLLM adds it again);
2. ``POST http://<router>/classify`` with ``{"model", "input", "use_activation": false}`` (vLLM's pooling API, which
   verl's router passes on to one of the model's servers);
3. the reward is ``data[-1].probs[-1]`` of the answer: the model's raw score.

Wiring (``scripts/train/exgrpo_qwen2.5_7b_base_wildchat_if.sh`` sets it when ``RM_GPUS_PER_NODE > 0``)::

    reward.custom_reward_function.path=pkg://recipe.exgrpo.reward_model_client
    reward.custom_reward_function.name=compute_score
    +reward.custom_reward_function.reward_kwargs.model=$RM_PATH    # the name vLLM serves it under (default: asked)
    reward.reward_model.rollout.free_cache_engine=false            # the model stays awake (start-up requires it)

How verl calls it: ``NaiveRewardManager.run_single`` awaits ``compute_score(data_source=, solution_str=,
ground_truth=, extra_info=, reward_router_address=, reward_model_tokenizer=, **reward_kwargs)`` (a coroutine
function) in verl's reward-loop workers, for every generated response and for the rows the trainer scores itself
(the replayed members). The prompt: verl does not pass it to reward functions, but its manager merges the row's
``tool_extra_fields`` into ``extra_info``; for a generated response those are the agent loop's extra fields, which
hold ``raw_prompt`` (the conversation), and for the rows the trainer scores it puts ``raw_prompt`` there itself
(``replay_step.scoring.with_prompt_for_reward_functions``).

Nothing waits for ever: every request has a total timeout (``timeout_s``), server errors (5xx) and connection
failures are retried ``max_retries`` times with a growing pause, a client error (4xx) is not retried, and then
:class:`RewardModelRequestError` names the URL and the last error (a reward is never silently 0).

Returns ``{"score": s}``: the reward, which is also the one key of ``reward_extra_info`` (the same every call, as
verl requires).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

DEFAULT_TIMEOUT_S = 600.0
DEFAULT_MAX_RETRIES = 4
#: the conversation of the prompt, as the agent loop's extra fields carry it into ``extra_info``
PROMPT_KEY = "raw_prompt"

#: the model name each router serves, asked once per process (``GET /v1/models``) when ``model`` is not given
_served_models: dict[str, str] = {}


class RewardModelRequestError(RuntimeError):
    """The reward model's router did not give a score: the URL and what went wrong."""


def reward_model_input(conversation: Sequence[dict], response: str, tokenizer: Any) -> str:
    """The reward model's text for ``conversation`` answered by ``response``: its chat template, BOS dropped."""
    chat = [{"role": str(m["role"]), "content": str(m["content"])} for m in conversation]
    chat.append({"role": "assistant", "content": response})
    text = tokenizer.apply_chat_template(chat, add_generation_prompt=False, tokenize=False)
    bos = getattr(tokenizer, "bos_token", None)
    if bos and text.startswith(bos):
        text = text[len(bos) :]
    return text


def _conversation(extra_info: Any) -> list[dict]:
    prompt = extra_info.get(PROMPT_KEY) if isinstance(extra_info, dict) else None
    if prompt is None:
        keys = sorted(extra_info) if isinstance(extra_info, dict) else type(extra_info).__name__
        raise ValueError(
            f"recipe.exgrpo.reward_model_client needs the prompt's conversation in extra_info[{PROMPT_KEY!r}] (verl's "
            f"agent loop puts it there for generated responses; the trainer for the rows it scores); got {keys}"
        )
    if hasattr(prompt, "tolist"):
        prompt = prompt.tolist()
    return list(prompt)


async def _request(method: str, url: str, payload: dict | None, timeout_s: float, max_retries: int) -> Any:
    import aiohttp

    last: str = "no attempt made"
    for attempt in range(max_retries + 1):
        try:
            timeout = aiohttp.ClientTimeout(total=timeout_s)
            async with aiohttp.ClientSession(timeout=timeout) as session:
                async with session.request(method, url, json=payload) as resp:
                    body = await resp.text()
                    if resp.status >= 500:
                        last = f"HTTP {resp.status}: {body[:300]}"
                    elif resp.status >= 400:
                        raise RewardModelRequestError(f"{method} {url}: HTTP {resp.status}: {body[:500]}")
                    else:
                        return json.loads(body)
        except RewardModelRequestError:
            raise
        except asyncio.TimeoutError:
            last = f"no answer within {timeout_s:g} s (reward_kwargs.timeout_s)"
        except (aiohttp.ClientError, OSError, ValueError) as e:
            last = f"{type(e).__name__}: {e}"
        if attempt < max_retries:
            await asyncio.sleep(min(2.0**attempt, 30.0))
    raise RewardModelRequestError(f"{method} {url}: no score after {max_retries + 1} attempts; last: {last}")


async def served_model(router: str, timeout_s: float = 60.0, max_retries: int = DEFAULT_MAX_RETRIES) -> str:
    """The name the reward model's server serves it under (``GET /v1/models``), asked once per router."""
    if router not in _served_models:
        answer = await _request("GET", f"http://{router}/v1/models", None, timeout_s, max_retries)
        try:
            _served_models[router] = str(answer["data"][0]["id"])
        except (KeyError, IndexError, TypeError) as e:
            raise RewardModelRequestError(f"GET http://{router}/v1/models: no model in {answer!r}") from e
    return _served_models[router]


async def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict | None = None,
    reward_router_address: str | None = None,
    reward_model_tokenizer: Any = None,
    *,
    model: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    max_retries: int = DEFAULT_MAX_RETRIES,
    **kwargs: Any,
) -> dict[str, float]:
    """The reward model's score of ``solution_str`` as the answer to the conversation in ``extra_info``.

    Args (the keyword-only ones come from ``reward.custom_reward_function.reward_kwargs``):
        data_source, ground_truth: unused (a reward model needs no reference).
        extra_info: verl's, holding the conversation (``raw_prompt``).
        reward_router_address, reward_model_tokenizer: what verl's reward loop passes with a reward model on.
        model: the name the model is served under (verl's vLLM server: ``reward.reward_model.model_path``);
            default: asked from the router once.
        timeout_s: total time of one request; max_retries: retries of a server error or a lost connection.
    """
    if not reward_router_address:
        raise ValueError(
            "recipe.exgrpo.reward_model_client scores with a reward model, but verl passed no reward_router_address: "
            "set reward.reward_model.enable=true (and its model_path)"
        )
    if reward_model_tokenizer is None:
        raise ValueError("recipe.exgrpo.reward_model_client: verl passed no reward_model_tokenizer")
    timeout_s, max_retries = float(timeout_s), int(max_retries)
    if not timeout_s > 0 or max_retries < 0:
        raise ValueError(f"reward_kwargs.timeout_s must be > 0 and max_retries >= 0, got {timeout_s}, {max_retries}")
    text = reward_model_input(_conversation(extra_info), solution_str, reward_model_tokenizer)
    name = model or await served_model(reward_router_address, min(timeout_s, 60.0), max_retries)
    url = f"http://{reward_router_address}/classify"
    payload = {"model": name, "input": text, "use_activation": False}
    answer = await _request("POST", url, payload, timeout_s, max_retries)
    try:
        score = float(answer["data"][-1]["probs"][-1])
    except (KeyError, IndexError, TypeError, ValueError) as e:
        raise RewardModelRequestError(f"POST {url}: no score in the answer {str(answer)[:300]}") from e
    return {"score": score}
