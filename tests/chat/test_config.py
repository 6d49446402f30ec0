"""The config file: defaults, types checked with the key named, flags on top, written back."""

from __future__ import annotations

import pytest

from ds4tui import paths
from ds4tui.config import Config, ConfigError, load_config, save_config, with_overrides


def test_missing_file_gives_defaults():
    assert load_config() == Config()
    assert Config().kv_dtype == "f16"


def test_kv_dtype_reaches_the_sessions(tmp_path):
    """The chat's sessions hold K/V of the configured type (llama family)."""
    import torch

    from ds4tui.engine.loader import load_model
    from tests.chat.conftest import make_controller

    model = load_model("tiny-llama")
    for dtype, torch_dtype in (("f16", torch.float16), ("f32", torch.float32)):
        ctl = make_controller(model, tmp_path / dtype, kv_dtype=dtype)
        conv = ctl.new_conversation()
        ctl.send(conv.key, "Hello there.", lambda e: None)
        assert ctl.get(conv.key).session.kv.dtype == torch_dtype


def test_file_values_are_read_and_ints_become_floats(tmp_path):
    paths.config_path().write_text('model = "tiny-llama"\ntemperature = 1\nmax_tokens = 64\nsystem_prompt = "Be brief."\n')
    config = load_config()
    assert (config.model, config.temperature, config.max_tokens, config.system_prompt) == (
        "tiny-llama", 1.0, 64, "Be brief.")
    assert isinstance(config.temperature, float)


@pytest.mark.parametrize("line, needle", [
    ("temperature = \"hot\"", "temperature must be int or float"),
    ("top_p = 1.5", "top_p must be within"),
    ("max_tokens = true", "max_tokens must be int, not a boolean"),
    ("colour = 1", "unknown key 'colour'"),
    ("model = ", "invalid TOML"),
    ("kv_dtype = \"bf16\"", 'kv_dtype must be "f16" or "f32"'),
])
def test_bad_values_name_the_key(line, needle):
    paths.config_path().write_text(line + "\n")
    with pytest.raises(ConfigError, match=needle):
        load_config()


def test_flags_override_and_none_means_unset():
    config = with_overrides(Config(budget_mb=10), budget_mb=None, ctx=512, model="tiny-llama")
    assert (config.budget_mb, config.ctx, config.model) == (10, 512, "tiny-llama")
    with pytest.raises(ConfigError, match="command line: ctx must be > 0"):
        with_overrides(Config(), ctx=0)


def test_save_round_trips_awkward_strings():
    config = Config(system_prompt='Quote " backslash \\ newline\n tab\t del\x7f é', temperature=0.2)
    save_config(config)
    assert load_config() == config


def test_the_checkpoint_interval_comes_from_the_config(tmp_path):
    default = Config().cache_policy()
    assert default.continued_step == 10240 and default.budget_mb == 4096  # ds4's: 10000 up to 2048
    path = tmp_path / "config.toml"
    path.write_text("continued_interval_tokens = 3000\ncheckpoint_align_tokens = 1024\nbudget_mb = 64\n")
    policy = load_config(path).cache_policy()
    assert policy.continued_step == 3072 and policy.budget_mb == 64
    assert policy.next_continued_frontier(5000) == 6144
    path.write_text("checkpoint_align_tokens = 100\n")
    with pytest.raises(ConfigError, match="checkpoint_align_tokens must be a positive multiple of 64"):
        load_config(path)
