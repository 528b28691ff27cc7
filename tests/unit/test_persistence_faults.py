"""Fault tests of the pool checkpoint (``save_experience`` / ``load_experience``): saves SIGKILLed at random moments
and at every step of the write, and every file damaged (truncations and byte flips, the header included).

Each case must load exactly a state that was saved (compared by a digest of the whole state) or raise
``PoolCheckpointError`` naming the damaged file: never a silent difference, never another exception.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from exgrpo.experience import PoolCheckpointError, experience_exists, load_experience, save_experience
from tests.helpers.experience import header_body, write_header
from tests.unit.pool_fault_driver import CRASH_POINTS, N_STATES, build_state, components, state_digest

REPO = Path(__file__).resolve().parents[2]
FILES = ("header.json", "entries.arrow", "tokens.arrow")


@pytest.fixture(scope="module")
def states():
    built = [build_state(i) for i in range(N_STATES)]
    digests = [state_digest(*s) for s in built]
    assert len(set(digests)) == N_STATES, "the fault tests need distinct states"
    return built, digests


def save(directory: Path, state, fsync: bool = False) -> Path:
    pool, sampler, selector, schedule = state
    return save_experience(directory, pool=pool, sampler=sampler, selector=selector, schedule=schedule, fsync=fsync)


def load_digest(directory: Path) -> str:
    pool, sampler, selector, schedule = components()
    load_experience(directory, pool=pool, sampler=sampler, selector=selector, schedule=schedule)
    return state_digest(pool, sampler, selector, schedule)


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.parent.glob(f".{directory.name}.*"))


# ------------------------------------------------------------------------------------------- damaged files


def _damage_cases(size: int, rng: random.Random) -> list[tuple]:
    cases: list[tuple] = [("truncate", 0), ("truncate", size - 1), ("truncate", size // 2)]
    cases += [("truncate", rng.randrange(size)) for _ in range(8)]
    cases += [("flip", 0, 0x01), ("flip", size - 1, 0x80), ("append", b"\0")]
    cases += [("flip", rng.randrange(size), rng.randrange(1, 256)) for _ in range(40)]
    return cases


def _apply(data: bytes, case: tuple) -> bytes:
    if case[0] == "truncate":
        return data[: case[1]]
    if case[0] == "append":
        return data + case[1]
    out = bytearray(data)
    out[case[1]] ^= case[2]
    return bytes(out)


@pytest.mark.parametrize("name", FILES)
def test_every_damaged_file_raises_naming_it(tmp_path, states, name):
    built, digests = states
    d = save(tmp_path / "pool", built[1])
    pristine = (d / name).read_bytes()
    rng = random.Random(f"damage:{name}")
    errors = 0
    for case in _damage_cases(len(pristine), rng):
        (d / name).write_bytes(_apply(pristine, case))
        try:
            digest = load_digest(d)
        except PoolCheckpointError as e:
            assert name in str(e), f"{case}: the error does not name {name}: {e}"
            errors += 1
        else:  # only acceptable when the state is exactly the saved one
            assert digest == digests[1], f"{name} {case}: loaded a different state without an error"
    assert errors > 0
    (d / name).write_bytes(pristine)
    assert load_digest(d) == digests[1]


def test_a_missing_file_raises_naming_it(tmp_path, states):
    built, _ = states
    for name in FILES:
        d = save(tmp_path / name / "pool", built[0])
        (d / name).unlink()
        with pytest.raises(PoolCheckpointError, match=rf"{name}: missing"):
            load_digest(d)


def _dup_question(b):
    b["pool"]["questions"][1] = b["pool"]["questions"][0]


def _short_question_table(b):
    b["pool"]["questions"].pop()


def _unknown_bucket_member(b):
    b["pool"]["bucket_members"][1].append("no-such-question")


def _bad_counters(b):
    b["pool"]["counters"] = {"added": "many"}


def _bad_retired(b):
    b["pool"]["retired"] = [[1]]


def _more_entries(b):
    b["pool"]["num_entries"] += 1


def _bad_next_id(b):
    b["pool"]["next_entry_id"] = "x"


def _pool_not_a_dict(b):
    b["pool"] = []


def _overlapping_batches(b):
    b["files"]["tokens.arrow"]["batches"][0]["rows"][1] += 1


def _malformed_batch(b):
    b["files"]["tokens.arrow"]["batches"] = [{"rows": [0]}]


def _bad_sampler_state(b):
    b["sampler"] = {"rng": 5}


def _bad_schedule_state(b):
    b["schedule"] = "on"


def _no_k(b):
    del b["pool"]["k"]


def _wrong_size_record(b):
    b["files"]["entries.arrow"]["bytes"] = "12"


@pytest.mark.parametrize(
    "tamper",
    [
        _dup_question,
        _short_question_table,
        _unknown_bucket_member,
        _bad_counters,
        _bad_retired,
        _more_entries,
        _bad_next_id,
        _pool_not_a_dict,
        _overlapping_batches,
        _malformed_batch,
        _bad_sampler_state,
        _bad_schedule_state,
        _no_k,
        _wrong_size_record,
    ],
)
def test_a_wrong_header_with_a_valid_checksum_raises_naming_it(tmp_path, states, tamper):
    """Every error path of the load after the checksums pass: a writer bug or a hand edit, never a raw exception."""
    built, _ = states
    d = save(tmp_path / "pool", built[1])
    body = header_body(d)
    tamper(body)
    write_header(d, body)
    with pytest.raises(PoolCheckpointError) as info:
        load_digest(d)
    assert any(name in str(info.value) for name in FILES), str(info.value)
    assert "header.json" in str(info.value) or tamper is _wrong_size_record, str(info.value)


def test_an_older_header_is_named_with_its_version(tmp_path, states):
    d = save(tmp_path / "pool", states[0][0])
    body = header_body(d)
    body["schema_version"] = 1
    (d / "header.json").write_text(json.dumps(body))  # the old format: no checksum frame
    with pytest.raises(PoolCheckpointError, match=r"header\.json: schema_version 1 is not supported") as info:
        load_digest(d)
    assert "exgrpo.resume_pool=empty" in str(info.value)  # says what to do
    body["schema_version"] = 99
    write_header(d, body)
    with pytest.raises(PoolCheckpointError, match=r"header\.json: schema_version 99 is not supported"):
        load_digest(d)
    (d / "header.json").write_text(json.dumps(body))  # a newer schema without this one's frame
    with pytest.raises(PoolCheckpointError, match=r"schema_version 99 is not supported.*newer version"):
        load_digest(d)


def test_a_current_header_without_its_trailing_newline_is_damaged_not_older(tmp_path, states):
    d = save(tmp_path / "pool", states[0][0])
    raw = (d / "header.json").read_bytes()
    assert raw.endswith(b"\n")
    (d / "header.json").write_bytes(raw[:-1])  # still valid JSON, naming schema_version 2 with its sha256
    with pytest.raises(PoolCheckpointError, match=r"header\.json: damaged header") as info:
        load_digest(d)
    assert "earlier version" not in str(info.value), str(info.value)


def test_every_damaged_header_says_it_is_damaged(tmp_path, states):
    """No damage to a current header may be reported as a header of another schema version."""
    d = save(tmp_path / "pool", states[0][1])
    pristine = (d / "header.json").read_bytes()
    rng = random.Random("damaged header wording")
    cases = _damage_cases(len(pristine), rng) + [("truncate", len(pristine) - k) for k in range(1, 80)]
    cases += [("flip", len(pristine) - 1, 0x0A ^ 0x20), ("append", b" "), ("append", b"\n")]  # still valid JSON
    for case in cases:
        (d / "header.json").write_bytes(_apply(pristine, case))
        with pytest.raises(PoolCheckpointError) as info:
            load_digest(d)
        message = str(info.value)
        assert "header.json" in message and ("damaged" in message or "corrupt" in message), f"{case}: {message}"
        assert "not supported" not in message, f"{case}: a damaged header reported as another version: {message}"


# ------------------------------------------------------------------------------------------------ SIGKILL


def _run_driver(tmp_path: Path, trials: list[dict]) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(trials))
    proc = subprocess.run(
        [sys.executable, "-m", "tests.unit.pool_fault_driver", str(plan)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


def _log(trial: dict) -> tuple[int, int, int]:
    """(last save that returned, last save that started, wait status) from the trial's log; -1 for none."""
    done, started, status = -1, -1, None
    for line in Path(trial["log"]).read_text().splitlines():
        word, _, value = line.partition(" ")
        if word == "done":
            done = int(value)
        elif word == "start":
            started = int(value)
        elif word == "exit":
            status = int(value)
    return done, started, status


def _state_of_save(i: int) -> int:
    """Save number i of the driver writes STATES[(i + 1) % 3]; the test put STATES[0] in place first (i = -1)."""
    return (i + 1) % N_STATES


def _trial(tmp_path: Path, name: str, built, **kwargs) -> dict:
    d = tmp_path / name / "pool"
    save(d, built[0])
    return {"dir": str(d), "log": str(tmp_path / f"{name}.log"), **kwargs}


def _check_next_save_cleans_up(d: Path, built, digests) -> None:
    save(d, built[2])
    assert leftovers(d) == [], "a successful save leaves no temporaries of interrupted saves"
    assert load_digest(d) == digests[2]


def test_sigkill_at_random_moments_loads_a_saved_state(tmp_path, states):
    built, digests = states
    rng = random.Random(20240917)
    trials = [_trial(tmp_path, f"t{i}", built, kill_after_s=rng.uniform(0.0, 0.8)) for i in range(10)]
    _run_driver(tmp_path, trials)
    landed_mid_save = 0
    for trial in trials:
        done, started, status = _log(trial)
        assert status is not None and status & 0x7F == 9, f"{trial}: not killed by SIGKILL (wait status {status})"
        allowed = {digests[_state_of_save(done)]}
        if started > done:  # killed inside save `started`: its state may or may not have been committed
            allowed.add(digests[_state_of_save(started)])
            landed_mid_save += 1
        d = Path(trial["dir"])
        assert experience_exists(d)
        assert load_digest(d) in allowed, f"{trial}: loaded state is none of the saved ones (log {done}/{started})"
        _check_next_save_cleans_up(d, built, digests)
    assert landed_mid_save >= 5, "the kills should mostly land inside a save"


def test_sigkill_at_every_step_of_a_save(tmp_path, states):
    """Deterministic kills at each step of an overwrite; the first five are before its commit point."""
    built, digests = states
    names = [point.replace("#", "_").replace("+", "p") for point in CRASH_POINTS]
    trials = [_trial(tmp_path, name, built, crash_at=point) for name, point in zip(names, CRASH_POINTS, strict=True)]
    _run_driver(tmp_path, trials)
    for point, trial in zip(CRASH_POINTS, trials, strict=True):
        done, started, status = _log(trial)
        assert (started, done) == (0, -1) and status & 0x7F == 9, f"{point}: crash point not reached ({status})"
        d = Path(trial["dir"])
        committed = point in ("replace#2+", "remove_leftovers#2")
        if point == "replace#2":  # between the two renames: the target is gone, the old copy waits aside
            assert not d.exists() and any(".old-" in n for n in leftovers(d))
        assert leftovers(d), f"{point}: the crash should leave a leftover behind"
        assert experience_exists(d)
        assert load_digest(d) == digests[_state_of_save(0 if committed else -1)], point
        _check_next_save_cleans_up(d, built, digests)


def test_no_loadable_copy_says_where_the_leftovers_are(tmp_path, states):
    built, _ = states
    d = save(tmp_path / "pool", built[0])
    d.rename(d.parent / ".pool.tmp-abc123")  # an uncommitted copy only
    with pytest.raises(PoolCheckpointError, match=r"no saved experience directory; leftovers .*\.pool\.tmp-abc123"):
        load_digest(d)
    assert not experience_exists(d)
    (d.parent / ".pool.tmp-abc123").rename(d.parent / ".pool.old-abc123")
    (d.parent / ".pool.old-abc123" / "tokens.arrow").write_bytes(b"")  # a damaged old copy is named, not loaded
    with pytest.raises(PoolCheckpointError, match=r"\.pool\.old-abc123"):
        load_digest(d)
