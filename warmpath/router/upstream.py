"""The body a request is sent to one node with: what that node's engine understands of the client's
request.

- A tiered fleet: the tier's own model name.
- An engine that rejects `suffix` (vLLM: "Unsupported param: suffix") gets the FIM prompt rendered
  here, the server's way (api/fim.py render): the family from the node's model name, repository
  context (`extra`) before the prefix, the family's stop tokens as stop strings (kept as text so
  they can match); a model of no known family completes from the prefix alone. Clients keep sending
  `suffix` to any fleet.
- Session hints the engine reads (llama.cpp's `cache_prompt`) unless the client set them.
- An editor protocol the engine does not speak: as an OpenAI request (translate.py); a whole answer
  from an engine that aborts only streams (llama-server): streamed, and collected by the router.
- A fill-in-the-middle answer from an engine with no completion scope: streamed, and cut by the
  router where `warmpath serve` would end it (scoping.py); mid-line its prompt leaves the line's
  last word for the engine to write again, constrained to (healing.py).
"""

from __future__ import annotations

import json

from warmpath.api.fim import ContextFile, Fill, detect_fim, render
from warmpath.router.healing import constraint, respelled
from warmpath.router.scoping import Scoped, body_cutter, fill_cutter, without_scope
from warmpath.router.translate import Collected, Translation, openai_request

STREAMED = {"stream": True, "stream_options": {"include_usage": True}}


def prepare(node, routed, own_model: bool,
            scope: str = "auto") -> tuple[str, bytes, Translation | Collected | Scoped
                                          | None]:
    """(path, body, conversion) of one attempt of `routed` (reading.Routed) on `node` (nodes.Node):
    an editor protocol the node's engine does not speak goes as an OpenAI request, translated back
    on its way out; a whole answer from an engine that aborts only streams is streamed and
    collected; a fill-in-the-middle answer from an engine with no completion scope is streamed and
    cut. `scope`: the router's default completion scope."""
    wire, engine = routed.wire, node.engine
    model = node.models[0] if node.models else ""
    if wire is not None and wire.__name__.rsplit(".", 1)[-1] not in engine.wires:
        if routed.ask is None:
            # the body did not parse: the protocol's own 400 (raises), as a node gives it
            wire.parse(routed.raw)
        model = model or routed.ask.model or ""
        path, body = openai_request(routed.ask, model)
        cutter = None if engine.applies_scope else fill_cutter(routed.ask, model, scope,
                                                               heals(engine))
        convert = Translation(wire, routed.ask, routed.model or model, cutter=cutter)
        if (cutter is not None or not engine.cancels_whole) and not routed.ask.stream:
            body, convert.collect = {**body, **STREAMED}, True
        return path, request_body(node, body, None, False, respelled(cutter)), convert
    body, raw = routed.body, routed.raw
    if wire is None and body is not None and not engine.applies_scope and "scope" in body:
        body, raw = without_scope(body), None  # the router applies it
    if (wire is None and routed.kind == "completion" and body is not None
            and not engine.applies_scope
            and (cutter := body_cutter(routed.body, model or str(body.get("model") or ""), scope,
                                       heals(engine))) is not None
            and Collected.streamed({**body, "stream": False}) is not None):
        return (routed.path,
                request_body(node, {**body, **STREAMED}, None, own_model, respelled(cutter)),
                Scoped(cutter, collect=not routed.stream))
    if wire is None and not engine.cancels_whole and body is not None and \
            (streamed := Collected.streamed(body)) is not None:
        return routed.path, request_body(node, streamed, None,
                                         own_model), Collected(routed.kind == "chat")
    return routed.path, request_body(node, body, raw, own_model), None


def heals(engine) -> bool:
    """Whether the router heals FIM prompts for this engine (EngineKind): it can be told how its
    answer begins."""
    return not engine.applies_scope and engine.start_constraint is not None


def request_body(node, body: dict | None, raw: bytes | None, own_model: bool,
                 give_back: str = "") -> bytes:
    """`node` a router/nodes.py Node; `body` the parsed request (None: sent as it came, the node
    judges it) and `raw` its bytes (None: always serialized); `own_model`: replace the model name
    with the node's (tiering); `give_back`: the end of the prompt a FIM prompt rendered here leaves
    out (healing.py)."""
    if body is None:
        return raw or b""
    engine, out = node.engine, dict(body)
    if own_model and node.models:
        out["model"] = node.models[0]
    if not engine.accepts_suffix and ("suffix" in out or "extra" in out) and isinstance(
            out.get("prompt"), str):
        out = render_fim(out, node.models[0] if node.models else str(out.get("model") or ""),
                         give_back)
        if give_back:
            out.update(constraint(engine.start_constraint, give_back))
    for field, value in engine.hints.items():
        out.setdefault(field, value)
    return raw if raw is not None and out == body else json.dumps(out).encode()


def render_fim(body: dict, model: str, give_back: str = "") -> dict:
    """A completion request with `suffix` / `extra` as one plain prompt for `model`'s family
    (api/fim.py render, as the server renders it), for the model that node serves; `give_back` (the
    end of the prefix) left out of it."""
    out = dict(body)
    prefix, suffix, extra = out.pop("prompt"), out.pop("suffix", None) or "", out.pop(
        "extra", None) or []
    files = ([ContextFile(e.get("filename") or "", e.get("text") or "") for e in extra
              if isinstance(e, dict)] if isinstance(extra, list) else [])
    if give_back and prefix.endswith(give_back):
        prefix = prefix[:len(prefix) - len(give_back)]
    # These engines do not heal the prompt's last token (engine/healing.py): the anchored layout,
    # which keeps their prefix cache warm, would end the prompt inside a word mid-line unless the
    # router heals (healing.py); where it does not (no cutter to check the answer) the cursor layout
    # is used there (benchmarks/results/fim_layout_quality_*: measured by pass@1 both ways).
    layout = "anchored" if not prefix or prefix.endswith("\n") or give_back else "cursor"
    rendered = render(Fill(prefix=prefix, suffix=suffix, extra=files), detect_fim(model=model),
                      layout)
    out["prompt"] = rendered.text
    if rendered.stops:
        stop = out.get("stop") or []
        stop = [stop] if isinstance(stop, str) else list(stop)
        out["stop"] = stop + [s for s in rendered.stops if s not in stop]
        # the markers stay in the text the engine matches stop strings on
        out["skip_special_tokens"] = False
    return out
