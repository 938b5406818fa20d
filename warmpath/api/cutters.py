"""llama.cpp's generation limits for editor requests, on text deltas: `n_indent` (end before a line
that leaves the block) and a chain of such cutters (with the completion scope, api/scope.py).
`t_max_predict_ms` is jobs.run's (it needs the clock). Each holds back as little as it can, so a
streamed completion still arrives token by token."""

from __future__ import annotations


class IndentCutter:
    """End the completion before the first new line that starts less indented than `indent` columns
    (spaces and tabs count one each, as in llama.cpp): the model has left the block being completed.
    Blank lines never end it. Holds back only a new line's leading whitespace, until its first other
    character shows."""

    def __init__(self, indent: int):
        self.indent = indent
        self.pending = ""  # "\n" + whitespace whose line is not known yet
        self.cut = False

    def feed(self, delta: str, final: bool = False) -> str:
        if self.cut:
            return ""
        buf, self.pending, out = self.pending + delta, "", []
        while buf:
            if not buf.startswith("\n"):
                j = buf.find("\n")
                if j < 0:
                    out.append(buf)
                    break
                out.append(buf[:j])
                buf = buf[j:]
                continue
            rest = buf[1:]
            body = rest.lstrip(" \t")
            if not body:  # only whitespace after the newline so far
                if final:
                    out.append(buf)
                else:
                    self.pending = buf
                break
            width = len(rest) - len(body)
            if body[0] == "\n":  # a blank line: shown, the next line decides
                out.append(buf[: 1 + width])
                buf = body
                continue
            if width < self.indent:
                self.cut = True
                break
            out.append("\n")
            buf = rest
        return "".join(out)


class Chain:
    """Cutters applied in order; cut when any has cut (those after it are flushed then)."""

    def __init__(self, *cutters):
        self.cutters = [c for c in cutters if c is not None]

    @property
    def cut(self) -> bool:
        return any(c.cut for c in self.cutters)

    @property
    def rule(self) -> str | None:
        """The completion scope's rule that cut (counted in /metrics); None for any other cut."""
        return next((c.rule for c in self.cutters if c.cut and getattr(c, "rule", None)), None)

    def feed(self, delta: str, final: bool = False) -> str:
        for c in self.cutters:
            delta = c.feed(delta, final=final or self.cut)
        return delta
