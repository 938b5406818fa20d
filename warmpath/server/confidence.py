"""The confidence gate: silence, not a guess, when the model is unsure of a fill-in-the-middle
answer.

An unsure suggestion interrupts the developer as much as an error does. The gate judges the answer's
first line (up to and including the token that ends it, or the end of the answer): its confidence is
the geometric mean of its tokens' probabilities under the model (exp of their mean log-probability).
Below the threshold the answer is silenced: empty text, finish_reason "low_confidence", and decoding
stops at once. Until it is judged the answer's text is held back, so nothing of a silenced answer is
ever shown. Every FIM answer is judged (its confidence is reported beside the text); threshold 0
never silences."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

UNSURE = "low_confidence"  # the finish reason of a silenced answer


@dataclass
class Gate:
    threshold: float  # the least confidence shown, 0..1
    logprobs: list[float] = field(default_factory=list)
    code: bool = False  # the first line has shown a character that is not whitespace
    value: float | None = None  # the confidence, once judged
    passed: bool = False  # judged sure enough: the text held back has been shown

    @property
    def judged(self) -> bool:
        return self.value is not None

    @property
    def unsure(self) -> bool:
        return self.value is not None and self.value < self.threshold

    def observe(self, pieces: list[bytes], logprobs: list[float]) -> None:
        """The answer's next tokens (their bytes) and their log-probabilities."""
        for piece, logprob in zip(pieces, logprobs, strict=False):
            if self.value is not None:
                return
            self.logprobs.append(logprob)
            if b"\n" in piece and (self.code or piece.split(b"\n", 1)[0].strip()):
                self._judge()
            elif piece.strip():
                self.code = True

    def finish(self) -> None:
        """The answer ended before its first line did: judged on what there is."""
        if self.value is None:
            self._judge()

    def _judge(self) -> None:
        self.value = math.exp(sum(self.logprobs) / len(self.logprobs)) if self.logprobs else 1.0
