"""Exact integer arithmetic for tool calls: the calculator of the CPU tool demo, framework-free.

``calculate(expression)`` evaluates ``+ - * // % **`` and parentheses over integers (``/`` too, when it divides
exactly), parsed with :mod:`ast` and evaluated node by node: never ``eval``. Every bad call gets an answer that
starts with ``error:`` and says what was wrong (not a string, too long, a name or call, a division by zero, a result
or power too large), so a malformed call costs the model its reward, never the training step. Stateless: the same
expression always gives the same answer, which is what lets a replayed exchange keep the tool answer it stored
(docs/algorithm.md §14). verl reads it through the function-tool file ``recipe/exgrpo/agent_tools/calculator.py``.
"""

from __future__ import annotations

import ast
import operator

#: longest expression read (the toy sums are ~10 characters)
MAX_EXPRESSION_CHARS = 200
#: largest result, in decimal digits, and largest exponent: 9 ** 9 ** 9 must not take the worker's CPU
MAX_RESULT_DIGITS = 64
MAX_EXPONENT = 256

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.Div: None,  # exact division only, below
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


class CalculatorError(ValueError):
    """A call the calculator does not answer with a number (the message is what the model reads)."""


def _check_size(value: int) -> int:
    if abs(value) >= 10**MAX_RESULT_DIGITS:
        raise CalculatorError(f"result has more than {MAX_RESULT_DIGITS} digits")
    return value


def _evaluate(node: ast.AST) -> int:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, int):
            raise CalculatorError(f"only integers are allowed, got {node.value!r}")
        return _check_size(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, (ast.FloorDiv, ast.Mod, ast.Div)) and right == 0:
            raise CalculatorError("division by zero")
        if isinstance(node.op, ast.Pow):
            if right < 0:
                raise CalculatorError("negative exponents are not allowed")
            if right > MAX_EXPONENT:
                raise CalculatorError(f"exponent {right} is larger than {MAX_EXPONENT}")
            if abs(left) > 1 and right * len(str(abs(left))) > MAX_RESULT_DIGITS + 1:
                raise CalculatorError(f"result has more than {MAX_RESULT_DIGITS} digits")
        if isinstance(node.op, ast.Div):
            if left % right:
                raise CalculatorError(f"{left} / {right} is not an integer (use // for the quotient)")
            return _check_size(left // right)
        return _check_size(_BINARY[type(node.op)](left, right))
    what = type(node.op).__name__ if isinstance(node, (ast.BinOp, ast.UnaryOp)) else type(node).__name__
    raise CalculatorError(f"{what} is not allowed (integers, + - * / // % ** and parentheses only)")


def calculate(expression: object) -> str:
    """The calculator's answer to ``expression``: the integer result, or a line starting with ``error:``."""
    if not isinstance(expression, str):
        return f"error: expression must be a string, got {type(expression).__name__}"
    if len(expression) > MAX_EXPRESSION_CHARS:
        return f"error: expression is longer than {MAX_EXPRESSION_CHARS} characters"
    if not expression.strip():
        return "error: empty expression"
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError) as exc:
        return f"error: cannot parse {expression.strip()!r} ({type(exc).__name__})"
    try:
        return str(_evaluate(tree))
    except CalculatorError as exc:
        return f"error: {exc}"
    except RecursionError:
        return "error: expression is nested too deeply"
