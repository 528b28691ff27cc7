"""Hugging Face Hub access of the preprocessing commands: find out once whether the Hub answers.

Without a network, ``datasets.load_dataset`` and ``AutoTokenizer.from_pretrained`` retry for about 24 s per dataset
before they fail. So before its first Hub access a command asks once (one HEAD request to ``HF_ENDPOINT``, default
https://huggingface.co, through the usual ``HTTPS_PROXY``; at most ``PROBE_TIMEOUT_S`` seconds): when nothing
answers it switches this process to the Hub's offline mode (``HF_HUB_OFFLINE=1``: what the local cache holds is still
read, nothing else is asked for) and says so in one line. With ``HF_HUB_OFFLINE=1`` (or ``HF_DATASETS_OFFLINE=1``)
already set, nothing is asked.

    python -m data_preprocess.hub     # exit 0 when the Hub answers, 1 (and the line) when it does not
"""

from __future__ import annotations

import os
import sys
import threading
import urllib.error
import urllib.request

PROBE_TIMEOUT_S = 5.0
OFFLINE_VARS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
_TRUE = {"1", "true", "yes", "on"}
_checked: bool | None = None  # the probe's answer in this process


def endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def offline_requested() -> bool:
    """HF_HUB_OFFLINE / HF_DATASETS_OFFLINE set to a true value."""
    return any(os.environ.get(v, "").strip().lower() in _TRUE for v in OFFLINE_VARS)


def probe(timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """None when the Hub answers (any HTTP status counts: a gated dataset's 401 is an answer); else why not. The
    request runs in a thread so that a name lookup that hangs cannot hold the command past ``timeout_s``."""
    result: list[str | None] = []

    def ask() -> None:
        try:
            urllib.request.urlopen(urllib.request.Request(endpoint(), method="HEAD"), timeout=timeout_s).close()
            result.append(None)
        except urllib.error.HTTPError:
            result.append(None)
        except Exception as e:  # URLError (no route, name not known), timeouts, TLS errors
            reason = getattr(e, "reason", None) or e
            result.append(f"{type(e).__name__}: {reason}")

    thread = threading.Thread(target=ask, daemon=True)
    thread.start()
    thread.join(timeout_s + 1.0)
    return result[0] if result else f"no answer within {timeout_s:g} s"


def _go_offline() -> None:
    for var in OFFLINE_VARS:
        os.environ[var] = "1"
    # the libraries read the variables when they are imported: tell those already imported too
    hub = sys.modules.get("huggingface_hub.constants")
    if hub is not None:
        hub.HF_HUB_OFFLINE = True
    datasets_config = sys.modules.get("datasets.config")
    if datasets_config is not None:
        datasets_config.HF_HUB_OFFLINE = True
        datasets_config.HF_DATASETS_OFFLINE = True


def prepare(tag: str) -> bool:
    """Call before the first Hub access. True when the Hub will be asked; False in offline mode (requested, or
    switched on here because the Hub does not answer: then one line on stderr says so)."""
    global _checked
    if offline_requested():
        return False
    if _checked is None:
        why = probe()
        _checked = why is None
        if why is not None:
            _go_offline()
            print(
                f"[{tag}] the Hugging Face Hub ({endpoint()}) does not answer ({why}): reading only what the local "
                "cache holds (HF_HUB_OFFLINE=1 from here on; set it yourself to skip this check)",
                file=sys.stderr,
            )
    return _checked


def offline_hint(option: str) -> str:
    """What to do when a set is neither on a reachable Hub nor in the cache."""
    if not offline_requested():
        return f"pass a local file with {option}"
    return (
        f"the Hub is not asked in offline mode (HF_HUB_OFFLINE=1) and the local cache does not hold it: pass a local "
        f"file with {option}, or run this where the Hub is reachable (it then fills the cache)"
    )


def main(argv: list[str] | None = None) -> int:
    import argparse

    argparse.ArgumentParser(
        prog="python -m data_preprocess.hub",
        description="Whether the Hugging Face Hub answers (HF_ENDPOINT): exit 0 when it does, 1 (and why) when it "
        "does not or HF_HUB_OFFLINE=1 is set.",
    ).parse_args(argv)
    if offline_requested():
        print("[hub] HF_HUB_OFFLINE=1: the Hub is not asked", file=sys.stderr)
        return 1
    why = probe()
    if why is None:
        return 0
    print(f"[hub] the Hugging Face Hub ({endpoint()}) does not answer ({why})", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
