"""One engine as `warmpath serve` serves it, shared by every route: its model names and /v1/models
card, its prompt rules (the FIM format, the fitter, the answer's default scope and confidence
threshold), the jobs it runs, and each request's tenancy."""

from __future__ import annotations

from fastapi import Request

from warmpath.api.ask import Ask
from warmpath.api.fim import FimFormat, detect_fim, fim_stop_ids, suffix_tokens
from warmpath.api.protocol import ApiError
from warmpath.api.short_context import short_context_tokens
from warmpath.config import ServerConfig
from warmpath.engine.async_engine import AsyncEngine
from warmpath.engine.engine import Engine
from warmpath.models.registry import bundled
from warmpath.server.jobs import JobRunner
from warmpath.server.logprobs import LogprobFormatter
from warmpath.server.metrics import Metrics
from warmpath.server.prompt_fitter import PromptFitter
from warmpath.server.tenancy import Tenancy, tenancy
from warmpath.server.type_through import Suggestions


class ServedModel:
    def __init__(self, engine: Engine, config: ServerConfig):
        self.engine, self.config = engine, config
        self.tokenizer = tok = engine.tokenizer
        self.fim = detect_fim(tok)
        kept = suffix_tokens(config.fim_suffix_tokens, engine.cost.prompt_seconds_per_token,
                             engine.config.block_size)
        count = lambda text: len(tok.encode(text, add_bos=False))  # noqa: E731
        self.fitter = PromptFitter(tok, engine.max_model_len,
                                   FimFormat(self.fim, config.fim_layout, kept, count, tok))
        self.short_context_tokens = short_context_tokens(engine.cost.prompt_seconds_per_token,
                                                         engine.config.block_size,
                                                         config.short_context_ms)
        self.fim_stop_ids = fim_stop_ids(tok, self.fim) if self.fim else []
        if not 0.0 <= config.min_confidence <= 1.0:
            raise ValueError(f"--min-confidence must be in [0, 1], got {config.min_confidence}")
        self.encoder = self.fitter.encoder
        self.async_engine = AsyncEngine(engine)
        self.metrics = Metrics(lambda: self.async_engine.snapshot.stats)
        self.runner = JobRunner(engine, self.async_engine, self.metrics, self.fim)
        self.suggestions = Suggestions()  # each session's last answer, to type through
        self.logprob_format = LogprobFormatter(tok)
        self.model_name = config.served_model_name or engine.config.model
        # a bundled model is served by its Ollama `name:tag` too
        model = bundled(engine.config.model)
        tag = model.tag if model and not config.served_model_name else ""
        # listed, in order
        self.names = [self.model_name, *([tag] if tag and tag != self.model_name else [])]
        self.accepted_names = {*self.names, engine.config.model}
        self.model_card = self._model_card()

    def _model_card(self) -> dict:
        """The /v1/models entry, with what a deployer checks (warmpath's fields): the architecture,
        the file's quant mix (tensors per GGUF type) and what the native kernel reads, the FIM
        template and whether it takes repository context, the context length, and KV bytes per token
        in the cache's dtype."""
        cfg, native = self.engine.model_config, self.engine.runner.native
        return {
            "id": self.model_name,
            "object": "model",
            "created": 0,
            "owned_by": "warmpath",
            "max_model_len": self.engine.max_model_len,
            "architecture": cfg.architecture,
            "context_length": cfg.max_position_embeddings,
            "quantization": self.engine.tensor_types or None,
            "kernel_weights": native.weight_kinds if native else None,
            "fim_template": self.fim.name if self.fim else None,
            "repo_context": bool(self.fim and self.fim.file_sep),
            "fim_suffix_tokens": self.fitter.fim.suffix_tokens
            if self.fim else None,  # None: the whole suffix
            "short_context_tokens": self.short_context_tokens if self.fim else None,
            "kv_bytes_per_token": cfg.kv_bytes_per_token(self.engine.kv_dtype_name)
        }

    def tenancy(self, ask: Ask, request: Request) -> Tenancy:
        """The request's prefix-cache salt and session, scoped by its tenant (tenancy.py)."""
        return tenancy(request.headers, ask.user, ask.cache_salt, self.config.cache_isolation,
                       self.config.max_session_id_chars)

    def check_model(self, name: str | None) -> None:
        if name is not None and name not in self.accepted_names:
            raise ApiError(
                404, f"model {name!r} does not exist; this server serves {self.model_name!r}",
                param="model", code="model_not_found")
