"""The reward function of a reward model in its own pool (recipe/exgrpo/reward_model_client.py), called by verl's own
reward manager exactly as its reward loop calls it, against a stand-in for the reward model's router: a local HTTP
server that answers ``/classify`` and ``/v1/models`` as verl's router in front of vLLM's pooling server does. Real
HTTP; the stand-in's score is a function of the text it receives, so the test sees what the function sent."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
import torch

pytest.importorskip("verl")

from omegaconf import OmegaConf  # noqa: E402
from verl import DataProto  # noqa: E402
from verl.trainer.ppo.reward import load_reward_manager  # noqa: E402

from recipe.exgrpo import reward_model_client  # noqa: E402
from recipe.exgrpo.dataproto import as_dataproto, rows_of  # noqa: E402
from recipe.exgrpo.harness.assets import build_tokenizer  # noqa: E402
from recipe.exgrpo.replay_step.scoring import with_prompt_for_reward_functions  # noqa: E402

MODEL = "/models/Skywork-Reward-Llama-3.1-8B-v0.2"
CONVERSATION = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a prime."}]


def stand_in_score(text: str) -> float:
    """The stand-in model's score: how many times the response's marker word appears, plus a length term."""
    return text.count("seven") + len(text) / 1000.0


class StandInRouter:
    """Answers like verl's router in front of vLLM's pooling server; ``fail_first`` requests get a 503, ``hang``
    never answers (until the server closes)."""

    def __init__(self, fail_first: int = 0, hang: bool = False):
        self.requests: list[tuple[str, str, dict | None]] = []
        self.fail_first, self.hang = fail_first, hang
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _reply(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                outer.requests.append(("GET", self.path, None))
                if self.path == "/v1/models":
                    self._reply(200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})
                else:
                    self._reply(404, {"error": f"no route {self.path}"})

            def do_POST(self):
                payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append(("POST", self.path, payload))
                if outer.hang:
                    time.sleep(30)
                    return
                if outer.fail_first > 0:
                    outer.fail_first -= 1
                    self._reply(503, {"error": "engine busy"})
                elif self.path != "/classify":
                    self._reply(404, {"error": f"no route {self.path}"})
                elif payload.get("model") != MODEL:
                    self._reply(400, {"error": f"The model `{payload.get('model')}` does not exist."})
                else:
                    probs = [stand_in_score(payload["input"])]
                    self._reply(200, {"object": "list", "data": [{"index": 0, "probs": probs, "num_classes": 1}]})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()  # a real Hugging Face tokenizer with a ChatML template (the CPU assets' own)


def _manager(router: str, tokenizer, **reward_kwargs):
    """verl's reward manager with this reward function, as its RewardLoopWorker builds it for a reward model."""
    config = OmegaConf.create(
        {
            "reward": {
                "custom_reward_function": {
                    "path": "pkg://recipe.exgrpo.reward_model_client",
                    "name": "compute_score",
                    "reward_kwargs": reward_kwargs,
                },
                "reward_manager": {"source": "register", "name": "naive"},
            }
        }
    )
    return load_reward_manager(config, tokenizer, reward_router_address=router, reward_model_tokenizer=tokenizer)


def _row(tokenizer, response: str, extra: dict | None = None, streamed: bool = True) -> DataProto:
    """One response row as verl's reward manager receives it: from the agent loop while generating (``streamed``:
    its extra fields, the conversation among them, in ``tool_extra_fields``) or from the trainer's batch."""
    prompt = tokenizer.apply_chat_template(CONVERSATION, add_generation_prompt=True, tokenize=True)
    if hasattr(prompt, "input_ids"):
        prompt = prompt["input_ids"]
    resp = tokenizer(response, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    ids = torch.tensor([list(prompt) + resp])
    non_tensor = {
        "data_source": np.array(["wildchat_if"], dtype=object),
        "reward_model": np.array([{"ground_truth": "", "style": "model"}], dtype=object),
        "extra_info": np.array([dict(extra or {"index": 0, "question_id": "q"})], dtype=object),
        "raw_prompt": np.array([CONVERSATION], dtype=object),
    }
    if streamed:
        non_tensor["tool_extra_fields"] = np.array([{"raw_prompt": CONVERSATION, "turn_scores": []}], dtype=object)
    return DataProto.from_dict(
        tensors={
            "prompts": torch.tensor([list(prompt)]),
            "responses": torch.tensor([resp]),
            "input_ids": ids,
            "attention_mask": torch.ones_like(ids),
        },
        non_tensors=non_tensor,
    )


def _score(manager, row: DataProto) -> dict:
    # on the manager's own event loop, as verl's reward-loop worker runs it
    return manager.loop.run_until_complete(manager.run_single(row))


def _expected(tokenizer, response: str) -> float:
    chat = CONVERSATION + [{"role": "assistant", "content": response}]
    return stand_in_score(tokenizer.apply_chat_template(chat, add_generation_prompt=False, tokenize=False))


def test_verl_scores_a_generated_response_through_the_router(tokenizer):
    with StandInRouter() as router:
        manager = _manager(router.address, tokenizer, model=MODEL)
        out = _score(manager, _row(tokenizer, "seven is prime, seven"))
        assert out["reward_score"] == pytest.approx(_expected(tokenizer, "seven is prime, seven"))
        assert out["reward_extra_info"] == {"score": out["reward_score"]}  # what the agent loop reads
        ((method, path, payload),) = router.requests
        assert (method, path) == ("POST", "/classify") and payload["model"] == MODEL
        assert payload["use_activation"] is False
        # the reward model's chat template over the conversation and the response, as verl's own scoring builds it
        assert payload["input"].startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nName a prime.")
        assert payload["input"].endswith("<|im_start|>assistant\nseven is prime, seven<|im_end|>\n")
        # a better answer scores higher: the score is the model's, not a constant
        assert _score(manager, _row(tokenizer, "seven"))["reward_score"] < out["reward_score"]


def test_the_rows_the_trainer_scores_carry_the_prompt_for_the_function(tokenizer):
    """The replayed members reach the reward manager from the trainer's batch (no agent-loop extra fields): the
    trainer adds the conversation the way the agent loop does; without it the function says what is missing."""
    with StandInRouter() as router:
        manager = _manager(router.address, tokenizer, model=MODEL)
        bare = _row(tokenizer, "seven", streamed=False)
        with pytest.raises(ValueError, match=r"needs the prompt's conversation in extra_info\['raw_prompt'\]"):
            _score(manager, bare)
        out = _score(manager, as_dataproto(with_prompt_for_reward_functions(rows_of(bare))))
        assert out["reward_score"] == pytest.approx(_expected(tokenizer, "seven"))
        assert "raw_prompt" not in bare.non_tensor_batch["extra_info"][0]  # the batch's own rows are not changed


def test_the_served_name_is_asked_once_and_server_errors_are_retried(tokenizer, monkeypatch):
    monkeypatch.setattr(reward_model_client, "_served_models", {})
    with StandInRouter(fail_first=2) as router:
        manager = _manager(router.address, tokenizer, max_retries=3)
        for _ in range(2):
            assert _score(manager, _row(tokenizer, "seven"))["reward_score"] == pytest.approx(
                _expected(tokenizer, "seven")
            )
        assert [r[:2] for r in router.requests] == [("GET", "/v1/models")] + [("POST", "/classify")] * 4


def test_a_client_error_and_a_silent_router_end_in_a_named_error(tokenizer):
    with StandInRouter() as router:
        manager = _manager(router.address, tokenizer, model="/models/other")
        with pytest.raises(reward_model_client.RewardModelRequestError, match="HTTP 400.*does not exist"):
            _score(manager, _row(tokenizer, "seven"))
        assert len(router.requests) == 1  # a 4xx is not retried
    with StandInRouter(hang=True) as router:
        manager = _manager(router.address, tokenizer, model=MODEL, timeout_s=1, max_retries=1)
        start = time.monotonic()
        with pytest.raises(reward_model_client.RewardModelRequestError, match="no answer within 1 s"):
            _score(manager, _row(tokenizer, "seven"))
        assert time.monotonic() - start < 15 and len(router.requests) == 2


def test_without_a_reward_model_the_function_says_what_to_set(tokenizer):
    manager = _manager(None, tokenizer, model=MODEL)
    with pytest.raises(ValueError, match="reward.reward_model.enable=true"):
        asyncio.run(reward_model_client.compute_score("s", "seven", "", {"raw_prompt": CONVERSATION}, None, tokenizer))
    assert manager.reward_router_address is None
