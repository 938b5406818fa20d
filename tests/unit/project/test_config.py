"""config.py: the scheduler's knobs nested in EngineConfig (one flag each, as before), the fields
server and router share declared once, the few-word settings refused when a config is built, and the
product's defaults."""

import argparse
import dataclasses
import typing

import pytest

from warmpath import config
from warmpath.cli import build_parser, engine_config, from_args
from warmpath.config import EngineConfig, RouterConfig, SchedulerConfig, ServerConfig, ServiceConfig


def test_the_scheduler_knobs_are_one_nested_config_with_their_flags_kept():
    names = [{f.name for f in dataclasses.fields(cls)} for cls in (SchedulerConfig, EngineConfig)]
    assert not names[0] & names[1]  # declared once, in SchedulerConfig
    args = build_parser().parse_args([
        "serve", "--max-num-batched-tokens", "64", "--max-num-seqs", "8", "--step-target-ms", "0",
        "--no-warm-late-prompts", "--warm-up-tokens", "9"
    ])
    cfg = engine_config(args)
    assert cfg.scheduler == SchedulerConfig(64, 8, 0.0, False,
                                            SchedulerConfig.warm_up_tokens_per_tenant, 9)
    assert engine_config(build_parser().parse_args(["serve"])).scheduler == SchedulerConfig()


def test_serve_without_a_model_serves_the_code_model():
    assert engine_config(build_parser().parse_args(["serve"])).model == "qwen2.5-coder-0.5b"
    assert build_parser().parse_args(["fetch-model"]).name == "qwen2.5-coder-0.5b"
    assert build_parser().parse_args(["plan"]).model == "qwen2.5-coder-0.5b"


def test_server_and_router_declare_none_of_their_shared_fields_again():
    shared = {f.name for f in dataclasses.fields(ServiceConfig)}
    assert {"host", "port", "api_key", "api_keys_file", "max_body_bytes", "served_model_name",
            "completion_scope", "header_timeout"} <= shared
    for cls in (ServerConfig, RouterConfig):
        own = set(cls.__annotations__)
        # the router's own default port, 8080, beside a node's 8000
        assert own & shared <= {"port"}, cls
    assert (ServerConfig().port, RouterConfig().port) == (8000, 8080)
    route = build_parser().parse_args(["route", "--node", "http://a:1", "--api-key", "k"])
    assert from_args(RouterConfig, route) == RouterConfig(node=["http://a:1"], api_key="k")


@pytest.mark.parametrize(("cls", "field", "bad"), [(EngineConfig, "device", "tpu"),
                                                   (EngineConfig, "dtype", "int4"),
                                                   (EngineConfig, "kv_cache_dtype", "int4"),
                                                   (EngineConfig, "gemv_dtype", "int8"),
                                                   (EngineConfig, "kernel", "fast"),
                                                   (EngineConfig, "kernel_activations", "x"),
                                                   (EngineConfig, "speculative_method", "eagle"),
                                                   (ServerConfig, "cache_isolation", "tenant"),
                                                   (ServerConfig, "fim_layout", "suffix-first"),
                                                   (ServerConfig, "completion_scope", "word"),
                                                   (RouterConfig, "completion_scope", "word"),
                                                   (RouterConfig, "policy", "random")])
def test_a_few_word_setting_is_refused_when_the_config_is_built(cls, field, bad):
    allowed = typing.get_args(typing.get_type_hints(cls)[field])
    with pytest.raises(ValueError,
                       match=f"^{field} must be one of {', '.join(allowed)}; got '{bad}'$"):
        cls(**{field: bad})
    for good in allowed:
        assert getattr(cls(**{field: good}), field) == good
    flag = "--" + field.replace("_", "-")
    with pytest.raises(SystemExit):  # argparse lists the choices too
        build_parser().parse_args(["serve" if cls is not RouterConfig else "route", flag, bad])


def test_the_words_match_the_modules_that_act_on_them():
    from warmpath.api.fim import LAYOUTS
    from warmpath.api.scope import SCOPES
    from warmpath.engine.speculator import PROPOSERS
    from warmpath.kernels.native import ACTIVATIONS
    from warmpath.router.policies import POLICIES

    assert typing.get_args(config.FimLayout) == LAYOUTS
    assert typing.get_args(config.CompletionScope) == SCOPES
    assert typing.get_args(config.RoutingPolicy) == POLICIES
    assert typing.get_args(config.KernelActivations) == ("auto", *ACTIVATIONS)
    assert typing.get_args(config.SpeculativeMethod) == ("none", *PROPOSERS)


def test_every_flag_keeps_its_help_and_type():
    parser = argparse.ArgumentParser()
    from warmpath.cli import add_flags

    add_flags(parser, EngineConfig)
    actions = {a.dest: a for a in parser._actions}
    assert actions["max_num_batched_tokens"].type is int and actions["step_target_ms"].type is float
    assert actions["num_kv_blocks"].type is int and actions["memory_budget"].type is str
    assert actions["device"].choices == ("cpu", "cuda")
    assert "Per-step token budget" in actions["max_num_batched_tokens"].help
