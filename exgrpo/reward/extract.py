"""Answer extraction for the verifiable reward (docs/rewards_and_data.md): the think gate, the last ``\\boxed{}`` and
the option letter of multiple-choice questions.

Everything here is plain string scanning that runs in time linear in the response length (no backtracking
regular expressions over the whole response, no rescan per unclosed box), so it runs in the caller's thread;
its time still counts against the call's deadline (``exgrpo.reward.score``), and the math-verify comparison
(``exgrpo.reward.math_verifier``) runs in a grader process under that deadline (``exgrpo.reward.isolation``).
"""

from __future__ import annotations

import re

THINK_CLOSE = "</think>"
# How a hermes-format chat template (Qwen2.5's, Qwen3's) wraps a tool's answer inside a multi-turn exchange; both
# are plain text after decoding (skip_special_tokens keeps them), so the tool's output is part of what verl grades.
TOOL_RESPONSE_OPEN = "<tool_response>"
TOOL_RESPONSE_CLOSE = "</tool_response>"

# ``\fbox`` is what some models write instead of ``\boxed``; both mark the final answer (``_BOX`` below).

# Option labels: MMLU-Pro has up to ten options (A-J); a few ARC-Challenge questions number them 1-5.
LETTER_LABELS = "ABCDEFGHIJ"
DIGIT_LABELS = "123456789"


def split_after_think(text: str, marker: str = THINK_CLOSE) -> str | None:
    """The text after the *last* ``</think>``, or None when the response never closes its think block.

    The released reward graded only what follows ``</think>`` and gave 0 without it (docs/algorithm.md §10); taking
    the last marker means a model that re-opens and closes thinking is graded on its final solution section.
    """
    idx = text.rfind(marker)
    if idx < 0:
        return None
    return text[idx + len(marker) :]


def strip_tool_responses(
    text: str, open_marker: str = TOOL_RESPONSE_OPEN, close_marker: str = TOOL_RESPONSE_CLOSE
) -> str:
    """``text`` without its tool answers: every ``<tool_response>...</tool_response>`` span removed, markers included.

    In a tool-calling exchange the decoded response holds the tool's outputs between the model's turns; a tool that
    prints ``\\boxed{...}`` (or ``</think>``) must not be graded as the model's answer. A span left open (the exchange
    was cut inside a tool's answer) runs to the end: nothing after it is the model's. One pass with ``str.find``, so
    linear in the length of ``text`` however many spans never close.
    """
    parts: list[str] = []
    pos = 0
    while True:
        start = text.find(open_marker, pos)
        if start < 0:
            parts.append(text[pos:])
            break
        parts.append(text[pos:start])
        end = text.find(close_marker, start + len(open_marker))
        if end < 0:
            break
        pos = end + len(close_marker)
    return "".join(parts)


_BOX = re.compile(r"\\(?:boxed|fbox)")
# What matters to brace matching: an escape pair (``\{``, ``\}``, ``\\``: never opens or closes a group) or a brace.
_BRACE_TOKEN = re.compile(r"\\.|[{}]", re.S)


def _matching_braces(text: str, start: int) -> dict[int, int]:
    """``{open index: close index}`` for every balanced group opening at or after ``start``, in one pass."""
    closes: dict[int, int] = {}
    stack: list[int] = []
    for m in _BRACE_TOKEN.finditer(text, start):
        token = m.group()
        if token == "{":
            stack.append(m.start())
        elif token == "}" and stack:
            closes[stack.pop()] = m.start()
    return closes


def _box_content_at(text: str, start: int, command: str, closes: dict[int, int]) -> str | None:
    """Content of ``\\boxed{...}`` / ``\\boxed x`` starting at ``start``, or None if malformed or truncated.

    ``closes`` maps each ``{`` to its ``}`` (``_matching_braces``). The cost is O(1) plus the spaces after the
    command, so trying every box of a response stays linear.
    """
    i = start + len(command)
    n = len(text)
    if i < n and text[i].isalpha():
        return None  # another command that merely starts with the same letters (e.g. ``\boxedsymbol``)
    while i < n and text[i] in " \t":
        i += 1
    if i >= n:
        return None
    if text[i] == "{":
        close = closes.get(i)
        if close is None:
            return None  # truncated response: the box never closes
        return text[i + 1 : close]
    if i == start + len(command):
        return None  # ``\boxed`` glued to a non-brace, non-space character
    # ``\boxed 5`` (the MATH dataset's brace-less form): the answer runs to the next space or ``$``.
    end = i
    while end < n and not text[end].isspace() and text[end] != "$":
        end += 1
    return text[i:end] if end > i else None


def last_boxed(text: str) -> str | None:
    """Content of the last well-formed ``\\boxed{...}`` (or ``\\fbox{...}``) in ``text``; None when there is none.

    Nested braces are matched (``\\boxed{\\frac{1}{2}}`` gives ``\\frac{1}{2}``). A box left open at the end
    of a truncated response is skipped in favour of the previous complete one. Linear in the length of ``text``:
    the boxes are found in one scan and all braces matched in another, however many boxes never close.
    """
    boxes = [(m.start(), m.group()) for m in _BOX.finditer(text)]
    if not boxes:
        return None
    closes = _matching_braces(text, boxes[0][0])
    for start, command in reversed(boxes):
        content = _box_content_at(text, start, command, closes)
        if content is not None:
            return content
    return None


_WRAPPER = re.compile(r"^\\(?:text|textbf|mathrm|mathbf|mathit|textrm|bf|rm|mbox)\s*\{(.*)\}$", re.S)
# Forms of a boxed option besides the bare label; only upper-case labels, so a boxed expression such as
# ``a + b`` is never read as option A.
_FRAGMENT_FORMS = (
    re.compile(r"^\(([A-Z0-9])\)"),  # (B) 10 eV
    re.compile(r"^([A-Z0-9])[).:](?:\s|$)"),  # B) 10 eV / B. / B:
    re.compile(r"^(?i:option|choice)\s?\(?([A-Z0-9])\)?(?:[.:\s]|$)"),  # Option B / choice (B)
)
_FRAGMENT_MAX = 64  # a boxed option is short; longer boxed text is not an option and is not scanned further


def _label_from_fragment(fragment: str, labels: str) -> str | None:
    """The option label a boxed answer names: ``B``, ``(B)``, ``\\text{B}``, ``B) 10 eV``, ``Option B`` -> ``B``."""
    s = fragment.strip()[:_FRAGMENT_MAX].strip("$").strip()
    for _ in range(3):  # unwrap at most a few nested ``\text{\textbf{B}}`` layers
        m = _WRAPPER.match(s)
        if not m:
            break
        s = m.group(1).strip()
    s = s.strip("*").strip()
    if len(s) == 1:
        cand = s.upper()  # a lone boxed letter may be lower case
        return cand if cand in labels else None
    for form in _FRAGMENT_FORMS:
        m = form.match(s)
        if m:
            return m.group(1) if m.group(1) in labels else None
    return None


_ANSWER_WORD = re.compile(r"(?i)answer")
_PHRASE_WINDOW = 48  # characters after "answer" that may hold the label; bounds the cost of each match


def _phrase_pattern(labels: str) -> re.Pattern[str]:
    # "answer is (B)", "Answer: B", "ANSWER: $B$", "answer is **B**", "answer choice B"; the label itself is
    # case-sensitive (upper case only) so that "the answer is a ..." is not read as option A.
    cls = re.escape(labels)
    return re.compile(r"(?:\s*(?i:is))?(?:\s*(?i:option|choice))?[\s:\-*$(\[{]*([" + cls + r"])(?![A-Za-z0-9])")


def _final_line_pattern(labels: str) -> re.Pattern[str]:
    # a last line that is just the option: "B", "(B)", "B.", "**B**", "$B$", or "B) 10^-4 eV" / "B. text"
    cls = re.escape(labels)
    return re.compile(r"[\s*$]*\(?([" + cls + r"])(?:[).:](?:\s.*)?|\)?\**\$?\s*)$")


_PHRASE = {labels: _phrase_pattern(labels) for labels in (LETTER_LABELS, DIGIT_LABELS)}
_FINAL_LINE = {labels: _final_line_pattern(labels) for labels in (LETTER_LABELS, DIGIT_LABELS)}
_FINAL_LINE_MAX = 256


def choice_labels(ground_truth: str) -> str | None:
    """The label alphabet of a multiple-choice ground truth (``"C"`` -> A-J, ``"2"`` -> 1-9), or None."""
    gt = ground_truth.strip().strip("()").strip()
    if len(gt) == 1:
        if gt.upper() in LETTER_LABELS:
            return LETTER_LABELS
        if gt in DIGIT_LABELS:
            return DIGIT_LABELS
    return None


def extract_choice_label(text: str, labels: str = LETTER_LABELS) -> str | None:
    """The option a response chooses, by this rule (first that applies):

    1. the last ``\\boxed{}``, when it names an option (``\\boxed{B}``, ``\\boxed{(B)}``, ``\\boxed{\\text{B}}``,
       ``\\boxed{B) 10 eV}``, ``\\boxed{Option B}``; a lone lower-case boxed letter counts too);
    2. the last "answer is B" / "Answer: (B)" / "ANSWER: B" / "answer is **B**" phrase (GPQA's prompt asks for
       ``ANSWER: $LETTER``);
    3. the last non-empty line, when it is just the option (``B``, ``(B)``, ``B.``, ``**B**``, ``B) text``).

    Letters in running text ("option (A) is wrong, (C) ...") are deliberately ignored: models list options while
    reasoning, so a bare mention is no answer. Outside a box the label must be upper case. Returns the label
    (upper case) or None.
    """
    if labels not in _PHRASE:
        raise ValueError(f"labels must be {LETTER_LABELS!r} or {DIGIT_LABELS!r}, got {labels!r}")
    boxed = last_boxed(text)
    if boxed is not None:
        label = _label_from_fragment(boxed, labels)
        if label is not None:
            return label
    phrase = _PHRASE[labels]
    # Scan "answer" occurrences from the last one back, each within a short window, so the cost stays linear.
    for m in reversed(list(_ANSWER_WORD.finditer(text))):
        found = phrase.match(text, m.end(), min(len(text), m.end() + _PHRASE_WINDOW))
        if found:
            return found.group(1)
    stripped = text.rstrip()
    if not stripped:
        return None
    final_line = stripped[stripped.rfind("\n") + 1 :]
    if len(final_line) > _FINAL_LINE_MAX:
        return None
    m = _FINAL_LINE[labels].fullmatch(final_line)
    return m.group(1) if m else None


_WS = re.compile(r"\s+")
_SPACING = re.compile(r"\\[,;:! ]|\\(?:left|right|displaystyle)(?![A-Za-z])")


def canonical_answer(text: str) -> str:
    """A conservative normal form for the exact-match shortcut: answers equal here are equal for math-verify too.

    Only what LaTeX itself ignores is dropped (whitespace, spacing commands, ``\\left``/``\\right``, ``$``
    delimiters, a trailing full stop), so two different answers never collapse to the same string.
    """
    s = _SPACING.sub("", text)
    s = _WS.sub("", s).rstrip(".").strip("$").rstrip(".")
    return s
