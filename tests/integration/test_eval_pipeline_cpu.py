"""The whole evaluation pipeline on CPU with a tiny offline model: generate (HF backend, resumable), grade with
the reward's checker, and write results JSON/CSV, the paper-style Markdown table and the PNG chart.

Data: a slice of the real benchmarks in ../shared/data/benchmarks when present (``shared_benchmarks`` fixture,
skipped otherwise) and, always, a generated parquet in the same verl format. A random or barely trained model
writes near-garbage at 16 new tokens; what is checked is the pipeline, not the accuracy.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import os
import pathlib
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from exgrpo.eval.backends import HFBackend, build_backend
from exgrpo.eval.cli import EvalConfig, evaluate, generate
from exgrpo.eval.generate import PromptFormat, ResumeMismatchError, SamplingSettings, read_generations
from exgrpo.eval.grading import Grader
from exgrpo.eval.report import load_results, render_markdown
from recipe.exgrpo.harness.procs import run_captured

REPO = pathlib.Path(__file__).resolve().parents[2]
MAX_NEW_TOKENS = 16
SYSTEM = "Think inside <think></think>, then put the final answer in \\boxed{}."


# --- the tiny model ------------------------------------------------------------------------------------------


def _build_throwaway_model(out: pathlib.Path) -> pathlib.Path:
    """A random tiny Qwen2 with a byte-level BPE tokenizer and a ChatML template (used only when the shared
    CPU assets of recipe/exgrpo/harness/assets.py are unavailable)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from tests.helpers.tiny_qwen2 import tiny_qwen2

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(["The answer is \\boxed{42}. <think> so </think>"] * 20, trainer=trainer)
    template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", chat_template=template
    )
    fast.save_pretrained(out)
    torch.manual_seed(0)
    model = tiny_qwen2(
        len(fast),
        max_position_embeddings=8192,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        bos_token_id=None,
    )
    model.save_pretrained(out)
    return out


def _build_from_cpu_assets(out: pathlib.Path) -> pathlib.Path | None:
    """The project's tiny Qwen2 + byte-level ChatML tokenizer (recipe/exgrpo/harness/assets.py), randomly
    initialised: built in a second, with no warm-up and no cache, since accuracy does not matter here."""
    try:
        from recipe.exgrpo.harness.assets import TinyModelSpec, build_model, build_tokenizer, save_model
    except ImportError:
        return None
    tokenizer = build_tokenizer()
    # benchmark prompts are longer than the toy task's, so give the model room for them
    model = build_model(dataclasses.replace(TinyModelSpec(), max_position_embeddings=8192), tokenizer)
    save_model(model, tokenizer, out)
    return out


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> pathlib.Path:
    out = tmp_path_factory.mktemp("tiny_model")
    return _build_from_cpu_assets(out) or _build_throwaway_model(out)


# --- grading -------------------------------------------------------------------------------------------------


def _stub_score(response: str, ground_truth: str, *, data_source=None) -> bool:
    return f"\\boxed{{{ground_truth}}}" in response


def _grader(think_gate: bool) -> Grader:
    """The reward's checker when it is importable; a last-boxed stand-in only while it is being written."""
    try:
        return Grader(think_gate=think_gate, timeout_s=5.0)
    except (ImportError, AttributeError):
        return Grader(spec="tests.stub:score", fn=_stub_score, think_gate=think_gate)


# --- data ----------------------------------------------------------------------------------------------------


def _verl_row(source: str, question: str, answer: str, index: int) -> dict:
    return {
        "data_source": source,
        "prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
        "ability": "math",
        "reward_model": {"ground_truth": answer, "style": "rule"},
        "extra_info": {"index": index, "split": "test"},
    }


@pytest.fixture(scope="module")
def generated_data(tmp_path_factory) -> pathlib.Path:
    """ID-style file (an AIME question repeated 4x, as test_id.parquet repeats them, and MATH questions once) and
    an OOD multiple-choice file."""
    d = tmp_path_factory.mktemp("bench")
    rows = [_verl_row("aime", "What is 2 + 2?", "4", 0) for _ in range(4)]
    rows += [_verl_row("math", f"Compute {q} * 3.", str(3 * q), q) for q in range(3)]
    pq.write_table(pa.Table.from_pylist(rows), d / "id_small.parquet")
    ood = [_verl_row("gpqa", f"Pick one.\n\nA) {q}\nB) {q + 1}", "A", q) for q in range(2)]
    pq.write_table(pa.Table.from_pylist(ood), d / "gpqa_small.parquet")
    return d


def _config(model, data, out, **kw) -> EvalConfig:
    kw.setdefault("sampling", SamplingSettings(max_new_tokens=MAX_NEW_TOKENS, seed=1))
    return EvalConfig(
        model=str(model), data=[str(p) for p in data], out_dir=str(out), backend="hf", progress=False, **kw
    )


class CountingBackend:
    """Wraps a backend, counts generated samples and can stop after a number of batches (an interruption)."""

    def __init__(self, inner, stop_after_batches: int | None = None):
        self.inner, self.stop_after = inner, stop_after_batches
        self.name, self.tokenizer = inner.name, inner.tokenizer
        self.batches = self.samples = 0

    def generate(self, prompts, n, seeds):
        if self.stop_after is not None and self.batches >= self.stop_after:
            raise KeyboardInterrupt("simulated interruption")
        self.batches += 1
        self.samples += sum(n)
        return self.inner.generate(prompts, n, seeds)


class FailingBackend:
    name, tokenizer = "hf", None

    def generate(self, prompts, n, seeds):
        raise AssertionError("nothing should be regenerated")


# --- tests ---------------------------------------------------------------------------------------------------


def _check_outputs(results, paths, out: pathlib.Path, expected_benchmarks: set[str]) -> None:
    assert set(results.benchmarks) == expected_benchmarks
    for key in ("json", "csv", "markdown", "table_csv", "png"):
        assert paths[key].is_file() and paths[key].stat().st_size > 0, key
    assert paths["png"].read_bytes()[:4] == b"\x89PNG"
    table = paths["markdown"].read_text(encoding="utf-8")
    assert table.splitlines()[0].startswith("| Model | AIME24 | AIME25 | AMC | MATH-500 |")
    assert "| ExGRPO | 31.6 |" in table  # the paper's reference rows are printed beside ours
    back = load_results(paths["json"])
    assert render_markdown([back], "table1") == table  # reading the results back gives the same table
    meta = json.loads(paths["json"].read_text())["metadata"]
    assert meta["model"] and meta["backend"] == "hf"
    assert meta["template"]["kind"] == "chat" and meta["template"]["chat_template_sha"]
    assert meta["grader"]["grading"] == "paper" and meta["grader"]["think_gate"] is None and meta["grader"]["spec"]
    assert meta["sampling"]["max_new_tokens"] == MAX_NEW_TOKENS and meta["seed"] == 1
    assert meta["versions"]["transformers"] and "vllm" in meta["versions"]
    graded = [json.loads(line) for f in (out / "scores").glob("*.jsonl") for line in f.read_text().splitlines()]
    for b, m in results.benchmarks.items():
        # the reported score is the mean of that benchmark's graded samples, in percent
        scores = [g["score"] for g in graded if g["benchmark"] == b]
        assert m.score == pytest.approx(100 * sum(scores) / len(scores)), b
    assert len(graded) == sum(m.num_samples for m in results.benchmarks.values())
    assert {g["score"] for g in graded} <= {0.0, 1.0}


def test_pipeline_on_generated_data_resumes_without_regenerating(tiny_model, generated_data, tmp_path):
    data = [generated_data / "id_small.parquet", generated_data / "gpqa_small.parquet"]
    out = tmp_path / "eval"
    cfg = _config(tiny_model, data, out, batch_size=8, think_gate=False)
    # protocol plan: AIME has 4 copies per question -> 8 samples per copy (32 per question); MATH and GPQA 1
    expected_total = 32 + 3 + 2

    inner = HFBackend(str(tiny_model), cfg.sampling)
    interrupted = CountingBackend(inner, stop_after_batches=2)
    with pytest.raises(KeyboardInterrupt):
        generate(cfg, backend=interrupted)
    first = read_generations(cfg.generation_path(str(data[0])))
    assert len(first) == interrupted.samples > 0  # every finished batch was flushed
    # a crash in the middle of a write leaves a torn line: it is dropped and that sample regenerated
    with cfg.generation_path(str(data[0])).open("a", encoding="utf-8") as f:
        f.write('{"row": 99, "sample": 0, "resp')

    resumed = CountingBackend(inner)
    generate(cfg, backend=resumed)
    assert resumed.samples == expected_total - len(first)  # only what was missing
    all_records = {
        **{("id", *k): v for k, v in read_generations(cfg.generation_path(str(data[0]))).items()},
        **{("ood", *k): v for k, v in read_generations(cfg.generation_path(str(data[1]))).items()},
    }
    assert len(all_records) == expected_total
    for k, v in first.items():  # earlier samples were kept as they were
        assert all_records[("id", *k)]["response"] == v["response"]

    results, paths = evaluate(cfg, backend=FailingBackend(), grader=_grader(think_gate=False))
    _check_outputs(results, paths, out, {"aime", "math", "gpqa"})
    assert results.benchmarks["aime"].samples_per_question == 32 and results.benchmarks["aime"].num_questions == 1
    assert results.benchmarks["aime"].metric_name == "avg@32"
    assert results.benchmarks["math"].metric_name == "pass@1" and results.benchmarks["math"].num_questions == 3
    row = results.table_row()
    assert row.values["id_avg"] == pytest.approx(
        (results.benchmarks["aime"].score + results.benchmarks["math"].score) / 2
    )

    # resuming with different sampling settings is refused, naming the setting
    other = _config(tiny_model, data, out, sampling=SamplingSettings(max_new_tokens=MAX_NEW_TOKENS, seed=2))
    with pytest.raises(ResumeMismatchError, match="seed"):
        generate(other, backend=FailingBackend())


def test_pipeline_on_a_slice_of_the_real_benchmarks(tiny_model, shared_benchmarks, tmp_path):
    data = [shared_benchmarks / "test_id.parquet", shared_benchmarks / "gpqa_diamond.parquet"]
    out = tmp_path / "eval"
    # The dataset's system prompt is dropped by default (the paper's evaluation), which also keeps prompts short.
    cfg = _config(
        tiny_model,
        data,
        out,
        batch_size=32,
        max_questions_per_source=1,
        think_gate=False,
    )
    results, paths = evaluate(cfg, grader=_grader(think_gate=False))
    assert results.metadata["template"]["system_prompt_mode"] == "none"
    expected = {"aime", "aime25", "amc", "math", "minerva", "olympiad_bench", "gpqa"}
    _check_outputs(results, paths, out, expected)
    for b in ("aime", "aime25", "amc"):  # test_id.parquet already repeats these 32x: one sample per row
        assert results.benchmarks[b].metric_name == "avg@32" and results.benchmarks[b].num_questions == 1
    assert results.table_row().partial == frozenset({"ood_avg"})  # ARC-c and MMLU-Pro not evaluated here
    # a second run regenerates nothing
    again, _ = evaluate(cfg, backend=FailingBackend(), grader=_grader(think_gate=False))
    assert again.to_dict()["benchmarks"] == results.to_dict()["benchmarks"]


def test_command_line_run_and_report(tiny_model, generated_data, tmp_path):
    stub = tmp_path / "stubgrader.py"
    stub.write_text("def score(response, ground_truth, *, data_source=None):\n    return False\n")
    out = tmp_path / "cli"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    cmd = [sys.executable, "-m", "exgrpo.eval", "run", "--backend", "hf", "--model", str(tiny_model)]
    cmd += ["--data", str(generated_data / "gpqa_small.parquet"), "--out", str(out), "--no-progress"]
    cmd += ["--max-new-tokens", "8", "--n-samples", "2", "--grader", "stubgrader:score", "--no-think-gate"]
    cmd += ["--reference", "table5", "--label", "tiny"]
    # each command in its own session, killed when it ends, times out or the test is interrupted
    proc = run_captured(cmd, timeout_s=300, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| **tiny (ours) ‡** |" in proc.stdout and "| Llama3.1-8B base |" in proc.stdout
    # a run off the protocol says how (8 new tokens, 2 samples per row)
    assert "- tiny: 2 sample(s) per row" in proc.stdout and "max_new_tokens=8 (protocol: 8192)" in proc.stdout
    results = json.loads((out / "results.json").read_text())
    assert results["benchmarks"]["gpqa"]["samples_per_question"] == 2
    assert results["metadata"]["grader"] == {
        "spec": "stubgrader:score",
        "grading": "paper",
        "think_gate": None,
        "timeout_s": 10.0,
        "math_verify": results["metadata"]["versions"]["math-verify"],
    }
    rep = run_captured(
        [sys.executable, "-m", "exgrpo.eval", "report", str(out / "results.json"), "--reference", "table5"],
        timeout_s=120,
        env=env,
        cwd=REPO,
    )
    assert rep.returncode == 0, rep.stderr[-2000:]
    assert rep.stdout == (out / "table.md").read_text()


class OracleBackend:
    """Answers from a key: the first ``right`` samples of each request correctly, the rest wrongly."""

    name = "hf"

    def __init__(self, tokenizer, answers: dict[str, tuple[str, int]]):
        self.tokenizer, self.answers = tokenizer, answers

    def generate(self, prompts, n, seeds):
        from exgrpo.eval.backends import Completion

        out = []
        for prompt, k in zip(prompts, n):
            answer, right = next(v for q, v in self.answers.items() if q in prompt)
            texts = [
                f"<think>ok</think> The answer is \\boxed{{{answer if i < right else 'wrong'}}}." for i in range(k)
            ]
            out.append([Completion(t, 12, "stop") for t in texts])
        return out


def test_known_answers_give_the_hand_computed_table(tiny_model, generated_data, tmp_path):
    """End to end with the real checker: 8 of the 32 AIME samples right, 1 of 3 MATH questions, 2 of 2 GPQA."""
    from transformers import AutoTokenizer

    answers = {"What is 2 + 2?": ("4", 2), "Pick one.": ("A", 1)}  # AIME: 2 right of 8 per copy, 4 copies
    answers.update({f"Compute {q} * 3.": (str(3 * q), int(q == 0)) for q in range(3)})
    backend = OracleBackend(AutoTokenizer.from_pretrained(str(tiny_model)), answers)
    data = [generated_data / "id_small.parquet", generated_data / "gpqa_small.parquet"]
    cfg = _config(tiny_model, data, tmp_path / "oracle", think_gate=True, plot=False)
    results, paths = evaluate(cfg, backend=backend, grader=_grader(think_gate=True))
    bench = results.benchmarks
    assert bench["aime"].score == pytest.approx(100 * 8 / 32)
    assert bench["aime"].pass_at_k[4] == pytest.approx(100 * (1 - math.comb(24, 4) / math.comb(32, 4)))
    assert bench["math"].score == pytest.approx(100 / 3)
    assert bench["gpqa"].score == pytest.approx(100.0)
    row = results.table_row()
    assert row.values["id_avg"] == pytest.approx((25.0 + 100 / 3) / 2)
    assert row.values["ood_avg"] == pytest.approx(100.0)
    assert _table_cells_from(paths["markdown"].read_text())[:5] == ["25.0", "—", "—", "33.3", "—"]


def _table_cells_from(markdown: str) -> list[str]:
    line = next(ln for ln in markdown.splitlines() if ln.startswith("| **") and "(ours)" in ln)
    return [c.strip() for c in line.strip().strip("|").split("|")][1:]


def test_vllm_backend_without_vllm_says_what_to_do():
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed here")
    with pytest.raises(ImportError, match="--backend hf"):
        build_backend("vllm", "/nonexistent", SamplingSettings())


def test_prompt_format_system_prompt_modes(tiny_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    msgs = [{"role": "system", "content": "SYS"}, {"role": "user", "content": "Q?"}]
    dropped = PromptFormat().render(tok, msgs)  # the default: the dataset's system message is dropped
    assert "SYS" not in dropped and dropped.rstrip().endswith("assistant")
    assert dropped == tok.apply_chat_template([msgs[1]], tokenize=False, add_generation_prompt=True)
    assert "SYS" in PromptFormat(system_prompt=None).render(tok, msgs)  # --keep-system-prompt
    assert "NEW" in PromptFormat(system_prompt="NEW").render(tok, msgs)
    assert PromptFormat(template="plain", system_prompt=None).render(tok, msgs) == "SYS\n\nQ?\n"
    assert PromptFormat(template="llama_base").render(tok, msgs) == "User: Q? Answer: Let's think step by step.\n"


# --- data parallel: replica processes ------------------------------------------------------------------------


def test_replicas_split_the_work_and_resume_from_a_leftover_shard(tiny_model, generated_data, tmp_path, monkeypatch):
    """Two HF replica processes on CPU: the same orchestration as vLLM replicas on GPUs (exgrpo.eval.parallel)."""
    from exgrpo.eval.cli import _run_file
    from exgrpo.eval.generate import generation_fingerprint
    from exgrpo.eval.parallel import REPLICA_DIR, shard_path, shard_paths

    data = [generated_data / "id_small.parquet", generated_data / "gpqa_small.parquet"]
    cfg = _config(tiny_model, data, tmp_path / "dp", batch_size=8, data_parallel_size=2)
    # an earlier run was interrupted after one replica wrote one sample of AIME row 1
    id_gen = cfg.generation_path(str(data[0]))
    id_gen.parent.mkdir(parents=True)
    leftover = {"row": 1, "sample": 0, "data_source": "aime", "benchmark": "aime", "question_id": "x"}
    shard_path(id_gen, 0).write_text(json.dumps({**leftover, "response": "LEFTOVER"}) + "\n")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7")

    generated = generate(cfg)
    # the plan: 4 AIME rows x 8 (avg@32) + 3 MATH + 2 GPQA = 37 samples, one of them already there
    assert generated == {str(data[0]): 34, str(data[1]): 2}
    records = read_generations(id_gen)
    assert len(records) == 35 and len(read_generations(cfg.generation_path(str(data[1])))) == 2
    assert records[(1, 0)]["response"] == "LEFTOVER"  # merged, not generated again
    assert shard_paths(id_gen) == []
    status = [json.loads(p.read_text()) for p in sorted((cfg.out / REPLICA_DIR).glob("replica*.status.json"))]
    assert [s["cuda_visible_devices"] for s in status] == ["5", "7"]  # one slice of the visible GPUs each
    assert sum(n for s in status for n in s["generated"].values()) == 36
    assert all(sum(s["generated"].values()) > 0 for s in status)
    meta = json.loads(_run_file(cfg).read_text())["metadata"]
    assert meta["data_parallel_size"] == 2 and meta["template"]["chat_template_sha"]
    # same settings as the one-engine path: its store opens the merged file without complaint
    fp = generation_fingerprint(
        model=cfg.model, backend="hf", data=str(data[0]), prompt_format=cfg.prompt_format, sampling=cfg.sampling
    )
    assert json.loads(id_gen.with_name(id_gen.name + ".meta.json").read_text()) == json.loads(json.dumps(fp))
    assert generate(cfg) == {str(data[0]): 0, str(data[1]): 0}  # nothing left: no replica starts


def test_a_failed_replica_is_reported_with_its_log(tiny_model, generated_data, tmp_path):
    import shutil

    from exgrpo.eval.parallel import ReplicaError

    broken = tmp_path / "bad_weights"
    shutil.copytree(tiny_model, broken)
    for weights in broken.glob("*.safetensors"):
        weights.write_bytes(b"not a safetensors file")
    cfg = _config(broken, [generated_data / "gpqa_small.parquet"], tmp_path / "dp", data_parallel_size=2)
    with pytest.raises(ReplicaError, match=r"(?s)2 of 2 replicas failed.*replica0\.log.*Error"):
        generate(cfg)


def test_a_checkpoint_folder_without_weights_gets_the_merge_command(generated_data, tmp_path):
    hf = tmp_path / "exp" / "global_step_50" / "actor" / "huggingface"
    hf.mkdir(parents=True)
    (hf / "config.json").write_text("{}")
    cfg = _config(hf, [generated_data / "gpqa_small.parquet"], tmp_path / "out")
    with pytest.raises(FileNotFoundError) as err:
        generate(cfg)
    actor = hf.parent
    assert f"--local_dir {actor} --target_dir {actor.parent}/merged_hf" in str(err.value)
