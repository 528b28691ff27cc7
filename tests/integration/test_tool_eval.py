"""The evaluation with tools (recipe/exgrpo/tool_eval/) against training's tool agent loop.

A scripted model (the same fixed outputs for each question and turn, cut at the new tokens a turn may take) answers
through verl's ``AgentLoopWorker`` on the calculator task's composed training config, the path training's rollouts
take, and through the evaluation's backend with the settings it reads from the same overrides: the prompt ids, the
response ids and the loss mask are identical, exchange by exchange (a call answered, no call, a call the turn limit
leaves unanswered, a call of an unknown tool, a turn cut by the length limit). The control evaluates with other
limits and sees the ids differ, so the comparison can fail. Then the whole ``exgrpo.eval`` pipeline with the backend:
the per-answer figures in the records and the results, resuming, and the settings guarding a resume.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from exgrpo.eval.backends import SamplingSettings
from exgrpo.sandbox import isolation_available

QUESTIONS = {
    "Q1": ["CALL 523 + 47", "</think>\\boxed{570}"],  # a call, answered; then the answer
    "Q2": ["</think>\\boxed{81}"],  # no call
    "Q3": ["CALL 2 + 2", "CALL 3 + 3"],  # a second call: max_assistant_turns=2 ends the exchange on it
    "Q4": ['<tool_call>{"name": "search", "arguments": {"q": "x"}}</tool_call>', "</think>\\boxed{1}"],
    "Q5": ["x" * 300],  # longer than a turn may be: cut at the response length
}


def _turn_text(text: str) -> str:
    if text.startswith("CALL "):
        return '<tool_call>{"name":"calculator","arguments":{"expression":"' + text[5:] + '"}}</tool_call>'
    return text


def scripted_turn(tokenizer, prompt_ids: list[int], max_tokens: int) -> list[int]:
    """The fixed output for this prompt: its question's next turn (by the assistant turns the prompt holds), cut at
    ``max_tokens`` as an engine cuts it."""
    text = tokenizer.decode(prompt_ids)
    question = next(q for q in QUESTIONS if f"{q}:" in text)
    turn = text.count("<|im_start|>assistant") - 1
    ids = tokenizer.encode(_turn_text(QUESTIONS[question][turn]), add_special_tokens=False) + [tokenizer.eos_token_id]
    return ids[:max_tokens]


def messages(question: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"{question}: what is the sum? Put the final answer in \\boxed{{}}."}]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny random model with the calculator's tool tokens, and the calculator task's training overrides."""
    from recipe.exgrpo.harness.assets import TinyModelSpec, build_model, build_tokenizer, save_model
    from recipe.exgrpo.harness.demo import build_overrides, demo_run, tool_run
    from recipe.exgrpo.harness.tool_task import add_tool_tokens

    root = tmp_path_factory.mktemp("tool_eval")
    tokenizer = build_tokenizer()
    add_tool_tokens(tokenizer)
    save_model(build_model(TinyModelSpec(), tokenizer), tokenizer, root / "model")
    overrides = build_overrides(tool_run(demo_run(root / "out")), str(root / "model"), "train.parquet", "val.parquet")
    overrides.append("data.max_response_length=192")  # room for two calls and a tool answer (byte-level tokens)
    return SimpleNamespace(root=root, model=root / "model", tokenizer=tokenizer, overrides=overrides)


def training_exchanges(run) -> list[dict]:
    """Each question through verl's AgentLoopWorker on the composed training config (as a validation batch)."""
    from verl import DataProto
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.workers.rollout.replica import TokenOutput

    from recipe.exgrpo.cpu.hf_rollout import sampling_key
    from recipe.exgrpo.tool_eval.settings import compose_training_config

    config = compose_training_config(run.overrides)
    rollout = config.actor_rollout_ref.rollout
    max_model_len = rollout.prompt_length + rollout.response_length

    class Client:  # training's rollout server, reading each request as the hf rollout does
        async def generate(self, request_id, prompt_ids, sampling_params, **kwargs):
            key = sampling_key(rollout, max_model_len, len(prompt_ids), sampling_params)
            return TokenOutput(token_ids=scripted_turn(run.tokenizer, list(prompt_ids), key.max_tokens))

    worker = AgentLoopWorker(config, Client())
    raw = np.empty(len(QUESTIONS), dtype=object)
    raw[:] = [messages(q) for q in QUESTIONS]
    batch = DataProto.from_dict(
        non_tensors={"raw_prompt": raw, "agent_name": np.array(["tool_agent"] * len(QUESTIONS), dtype=object)},
        meta_info={"validate": True},
    )
    out = asyncio.run(worker.generate_sequences(batch))
    width = out.batch["prompts"].shape[1]
    rows = []
    for i in range(len(QUESTIONS)):
        attention = out.batch["attention_mask"][i].bool()
        prompt = out.batch["prompts"][i][attention[:width]].tolist()
        response = out.batch["responses"][i][attention[width:]].tolist()
        mask = out.batch["response_mask"][i][: len(response)].tolist()
        rows.append({"prompt": prompt, "response": response, "mask": mask})
    return rows


class ScriptedEngine:
    """The evaluation's engine, answering with the same fixed outputs."""

    name = "hf"

    def __init__(self, tokenizer, settings, model_path):
        self.tokenizer, self.model_path = tokenizer, str(model_path)
        self.eos_ids = {tokenizer.eos_token_id}
        self.max_model_len = settings.prompt_length + settings.response_length
        self.config = SimpleNamespace(
            prompt_length=settings.prompt_length, response_length=settings.response_length, temperature=1.0, top_p=1.0
        )
        self.batches: list[int] = []

    def generate(self, prompts, key, seeds, stop):
        self.batches.append(len(prompts))
        return [scripted_turn(self.tokenizer, p, key.max_tokens) for p in prompts]


def evaluation_exchanges(run, **changes):
    """The exchanges through the evaluation, on the settings it reads from the training overrides (``changes``:
    other values, the control's)."""
    import dataclasses

    from recipe.exgrpo.tool_eval.loop import ToolLoopBackend
    from recipe.exgrpo.tool_eval.settings import settings_from_training

    settings = dataclasses.replace(settings_from_training(run.overrides), **changes)
    engine = ScriptedEngine(run.tokenizer, settings, run.model)
    backend = ToolLoopBackend(engine, settings, SamplingSettings(temperature=1.0, max_new_tokens=192))
    results = backend.exchanges([(messages(q), 7, 0) for q in QUESTIONS])
    rows = [
        {"prompt": list(o.prompt_ids), "response": list(o.response_ids), "mask": list(o.response_mask)}
        for o, _ in results
    ]
    return rows, [c for _, c in results], engine


def test_a_fixed_model_output_gives_trainings_token_ids(run):
    training = training_exchanges(run)
    evaluation, answers, engine = evaluation_exchanges(run)
    for question, t, e in zip(QUESTIONS, training, evaluation):
        assert e == t, question
    assert engine.batches[0] == len(QUESTIONS)  # every answer's first turn in one engine call
    # what each exchange did, as the results report it
    figures = [
        (c.extra["tool_calls"], c.extra["tool_errors"], c.extra["unanswered_call"], c.extra["num_turns"])
        for c in answers
    ]
    assert figures == [(1, 0, False, 4), (0, 0, False, 2), (1, 0, True, 4), (1, 1, False, 4), (0, 0, False, 2)]
    assert [c.finish_reason for c in answers] == ["stop"] * 4 + ["length"]
    assert "570" in answers[0].text and answers[0].text.endswith("\\boxed{570}")
    assert len(evaluation[4]["response"]) == 192  # the response length of the training run
    # control: other limits than training's give other ids, so the comparison above can fail
    fewer_turns, _, _ = evaluation_exchanges(run, max_assistant_turns=1)
    assert fewer_turns[0] != training[0] and fewer_turns[1] == training[1]
    shorter, _, _ = evaluation_exchanges(run, response_length=64)
    assert shorter[4] != training[4] and len(shorter[4]["response"]) == 64


def test_the_settings_come_from_the_training_overrides_and_flags_win(run):
    from recipe.exgrpo.tool_eval.settings import settings_from_training

    settings = settings_from_training(run.overrides)
    assert (settings.max_user_turns, settings.max_assistant_turns, settings.format) == (1, 2, "hermes")
    assert (settings.prompt_length, settings.response_length, settings.max_tool_response_length) == (128, 192, 256)
    assert settings.function_tool_path.endswith("recipe/exgrpo/agent_tools/calculator.py")
    flagged = settings_from_training(run.overrides, {"max_user_turns": 3, "max_response_length": 256})
    assert (flagged.max_user_turns, flagged.response_length, flagged.max_assistant_turns) == (3, 256, 2)
    with pytest.raises(ValueError, match="function_tool_path: no tool file"):
        settings_from_training([])
    with pytest.raises(ValueError, match="no_such.py: no such file"):
        settings_from_training([], {"tools": str(run.root / "no_such.py")})


@pytest.mark.skipif(not all(isolation_available().values()), reason=f"no Landlock or seccomp: {isolation_available()}")
def test_the_sandboxed_python_tool_answers_through_the_evaluation(run):
    """The TIR runs' tool (recipe/exgrpo/agent_tools/python_tool.py, each call in the sandbox) behind the evaluation's
    loop: a call that prints comes back as the tool's answer, a call whose code raises is counted as a tool error."""
    from recipe.exgrpo.tool_eval.loop import ToolLoopBackend
    from recipe.exgrpo.tool_eval.settings import ToolLoopSettings

    repo = Path(__file__).resolve().parents[2]
    settings = ToolLoopSettings(
        function_tool_path=str(repo / "recipe" / "exgrpo" / "agent_tools" / "python_tool.py"),
        max_user_turns=1,
        max_assistant_turns=2,
        prompt_length=128,
        response_length=256,
        tool_env={"EXGRPO_SANDBOX_TIMEOUT_S": "10"},
    )
    code = {"P1": "print(6 * 7)", "P2": "1 / 0"}

    class PythonScript(ScriptedEngine):
        def generate(self, prompts, key, seeds, stop):
            out = []
            for p in prompts:
                text = self.tokenizer.decode(p)
                question = next(q for q in code if f"{q}:" in text)
                call = json.dumps({"name": "python", "arguments": {"code": code[question]}})
                turn = f"<tool_call>{call}</tool_call>" if "<|im_start|>tool" not in text else "</think>\\boxed{42}"
                out.append(self.tokenizer.encode(turn, add_special_tokens=False) + [self.tokenizer.eos_token_id])
            return out

    backend = ToolLoopBackend(PythonScript(run.tokenizer, settings, run.model), settings, SamplingSettings())
    (_, printed), (_, raised) = backend.exchanges([(messages("P1"), 0, 0), (messages("P2"), 0, 0)])
    assert "\n42\n" in printed.text and (printed.extra["tool_calls"], printed.extra["tool_errors"]) == (1, 0)
    assert "ZeroDivisionError" in raised.text and (raised.extra["tool_calls"], raised.extra["tool_errors"]) == (1, 1)


def _eval_data(path: Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [
        {
            "data_source": "toy_arithmetic_hard",
            "prompt": messages(q),
            "reward_model": {"ground_truth": answer, "style": "rule"},
        }
        for q, answer in (("Q1", "570"), ("Q2", "81"), ("Q3", "6"), ("Q4", "1"), ("Q5", "0"))
    ]
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_the_evaluation_pipeline_with_tools_reports_calls_errors_and_turns_and_resumes(run, monkeypatch):
    """``exgrpo.eval``'s generate, grade and report with the tool backend (the scripted engine behind it): the
    records carry the per-answer figures, the results the per-benchmark ones; a second run generates nothing; a run
    with other tool settings is refused on resume, naming them."""
    from exgrpo.eval.cli import evaluate
    from exgrpo.eval.config import EvalConfig
    from exgrpo.eval.generate import PromptFormat, ResumeMismatchError
    from recipe.exgrpo.tool_eval import loop as tool_loop
    from recipe.exgrpo.tool_eval.loop import FACTORY, ToolLoopBackend
    from recipe.exgrpo.tool_eval.settings import settings_from_training

    settings = settings_from_training(run.overrides)
    engines: list[ScriptedEngine] = []

    def build(cfg):  # the factory, with the scripted engine in place of the model
        engines.append(ScriptedEngine(run.tokenizer, settings, run.model))
        return ToolLoopBackend(engines[-1], settings, cfg.sampling)

    monkeypatch.setattr(tool_loop, "build_backend", build)
    data = _eval_data(run.root / "eval.parquet")
    cfg = EvalConfig(
        model=str(run.model),
        data=[str(data)],
        out_dir=str(run.root / "eval_out"),
        backend="hf",
        prompt_format=PromptFormat(system_prompt=None),
        sampling=SamplingSettings(max_new_tokens=192, n_samples=2),
        grading="reward",
        agent={"factory": FACTORY, **settings.as_dict()},
        strip_tool_responses=True,
        plot=False,
        progress=False,
    )
    results, paths = evaluate(cfg)
    records = [json.loads(line) for line in (run.root / "eval_out" / "generations" / "eval.jsonl").open()]
    assert len(records) == 10 and {"num_turns", "tool_calls", "tool_errors", "unanswered_call"} <= set(records[0])
    by_row = {r["row"]: r for r in records if r["sample"] == 0}
    assert (by_row[0]["tool_calls"], by_row[3]["tool_errors"], by_row[2]["unanswered_call"]) == (1, 1, True)
    tools = results.benchmarks["toy_arithmetic_hard"].tools
    assert tools["calls_per_answer"] == pytest.approx(3 / 5) and tools["tool_errors"] == 2
    # right: Q1 and Q4 (with a call), Q2 (without); wrong: Q3 (with), Q5 (without)
    assert tools["accuracy_with_call"] == pytest.approx(200 / 3) and tools["accuracy_without_call"] == 50.0
    assert results.benchmarks["toy_arithmetic_hard"].score == pytest.approx(60.0)
    assert "calls per answer" in paths["markdown"].read_text() and results.metadata["agent"]["max_user_turns"] == 1
    # resuming: nothing left to generate, no engine built
    evaluate(cfg)
    assert len(engines) == 1
    # other tool settings on the same output directory: refused, naming them
    other = EvalConfig(**{**cfg.__dict__, "agent": {**cfg.agent, "max_user_turns": 2}})
    with pytest.raises(ResumeMismatchError, match="agent"):
        evaluate(other)


def test_eval_tir_sh_runs_the_tool_loop_on_the_tir_training_runs_settings(tmp_path):
    """scripts/eval/eval_tir.sh hands the evaluation the TIR training script's own overrides (DRY_RUN=print), so the
    tool loop's settings are training's: the Python tool, 4 calls and 5 turns, 512-character tool answers, 1024 +
    8192 tokens, the sandbox's limits."""
    import shlex
    import subprocess

    from recipe.exgrpo.tool_eval.settings import settings_from_training

    repo = Path(__file__).resolve().parents[2]
    (tmp_path / "test_id.parquet").write_bytes(b"")  # the script only checks that the file exists
    env = {"PATH": "/usr/bin:/bin", "DRY_RUN": "print", "MODEL_PATH": str(tmp_path / "m"), "DATA_DIR": str(tmp_path)}
    proc = subprocess.run(["bash", "scripts/eval/eval_tir.sh"], cwd=repo, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    argv = shlex.split(proc.stdout)
    assert argv[1:4] == ["-m", "recipe.exgrpo.tool_eval", "run"]
    overrides = argv[argv.index("--training-overrides") + 1 :]
    settings = settings_from_training(overrides)
    assert settings.function_tool_path == str(repo / "recipe" / "exgrpo" / "agent_tools" / "python_tool.py")
    assert (settings.max_user_turns, settings.max_assistant_turns, settings.max_parallel_calls) == (4, 5, 1)
    assert (settings.max_tool_response_length, settings.prompt_length, settings.response_length) == (512, 1024, 8192)
    assert (
        settings.tool_env["EXGRPO_SANDBOX_TIMEOUT_S"] == "10"
        and settings.tool_env["EXGRPO_SANDBOX_SITE_PACKAGES"] == "1"
    )
