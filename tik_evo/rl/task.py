"""A synthetic verifiable task, generated in the repository: multi-digit addition.

A prompt is "a+b=" (optionally left-padded to a fixed length), the answer the digits of a + b followed by the
end-of-sequence token. The reward is 1.0 when the tokens before the first EOS spell the sum and an EOS was
produced, else 0.0: verifiable, no learned reward model.

The tokenizer has 14 symbols; the model's vocabulary may be larger (a Qwen3-shaped lm_head has 151,936 rows):
ids past the tokenizer's decode to "?" and never earn a reward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

SYMBOLS = ("<pad>", "<eos>", *"0123456789", "+", "=")
PAD, EOS = 0, 1
_ID = {s: i for i, s in enumerate(SYMBOLS)}


def encode(text: str) -> list[int]:
    """Token ids of a string of digits, "+" and "="."""
    try:
        return [_ID[c] for c in text]
    except KeyError as e:
        raise ValueError(f"encode: {e.args[0]!r} is not a symbol of the addition task ({''.join(SYMBOLS[2:])})"
                         ) from None


def decode(ids) -> str:
    """Text of token ids: PAD as "_", EOS as "$", an id outside the tokenizer as "?"."""
    special = {PAD: "_", EOS: "$"}
    return "".join(special.get(i, SYMBOLS[i] if 0 <= i < len(SYMBOLS) else "?") for i in map(int, ids))


@dataclass(frozen=True)
class Problem:
    a: int
    b: int

    @property
    def answer(self) -> str:
        return str(self.a + self.b)


def reward(problem: Problem, completion) -> float:
    """1.0 if the completion's tokens before its first EOS are the digits of the sum and it has an EOS, else 0.0."""
    ids = [int(i) for i in completion]
    if EOS not in ids:
        return 0.0
    return 1.0 if ids[:ids.index(EOS)] == encode(problem.answer) else 0.0


@dataclass
class AdditionTask:
    """Problems with operands of `digits` digits (leading digit non-zero); `prompt_len` left-pads every prompt
    with PAD to that many tokens (0: no padding), so a benchmark can set the prompt length it needs."""

    digits: int = 3
    prompt_len: int = 0

    def __post_init__(self):
        if self.digits < 1:
            raise ValueError(f"AdditionTask: digits {self.digits} must be at least 1")
        if self.prompt_len and self.prompt_len < 2 * self.digits + 2:
            raise ValueError(f"AdditionTask: prompt_len {self.prompt_len} is shorter than a prompt "
                             f"({2 * self.digits + 2} tokens for {self.digits}-digit operands)")

    @property
    def max_answer(self) -> int:
        """Tokens of the longest correct completion (the sum's digits and EOS)."""
        return self.digits + 2

    def sample(self, n: int, generator: torch.Generator) -> list[Problem]:
        lo, hi = 10 ** (self.digits - 1), 10 ** self.digits
        ab = torch.randint(lo, hi, (n, 2), generator=generator).tolist()
        return [Problem(a, b) for a, b in ab]

    def prompt(self, problem: Problem) -> list[int]:
        ids = encode(f"{problem.a}+{problem.b}=")
        return [PAD] * max(self.prompt_len - len(ids), 0) + ids

    def target(self, problem: Problem) -> list[int]:
        """The correct completion (for the supervised warm-up)."""
        return encode(problem.answer) + [EOS]
