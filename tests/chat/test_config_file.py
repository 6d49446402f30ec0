"""Settings written back into the user's config file: in place, their comments and other keys
kept, atomically, and never over a file ds4tui cannot edit safely."""

from __future__ import annotations

import os
import tomllib

import pytest

from ds4tui import paths
from ds4tui.config import Config, ConfigError, load_config, save_config
from ds4tui.config_file import edit_text, update_config_file

USERS_FILE = '''# my ds4tui settings
model = "smollm2-135m-instruct"   # the small one
temperature = 0.3
system_prompt = """Be brief.
Answer in English."""

# presets I use
[system_prompts]
terse = "One sentence."  # for quick questions
'''


def test_changed_keys_are_edited_in_place_and_everything_else_kept():
    path = paths.config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(USERS_FILE)
    update_config_file({"temperature": 0.5, "theme": "nord"},
                       tables={"system_prompts": {"code review": "Bugs first.", "terse": "One line."}})
    text = path.read_text()
    assert text.splitlines()[:2] == ["# my ds4tui settings", 'model = "smollm2-135m-instruct"   # the small one']
    assert "temperature = 0.5\n" in text and "temperature = 0.3" not in text
    assert '"""Be brief.\nAnswer in English."""' in text  # the multi-line string as the user wrote it
    assert "# presets I use\n[system_prompts]\n" in text
    assert 'terse = "One line."  # for quick questions\n' in text  # the line's own comment stays
    config = load_config()
    assert config.theme == "nord" and config.temperature == 0.5
    assert config.system_prompts == {"terse": "One line.", "code review": "Bugs first."}
    assert config.system_prompt == "Be brief.\nAnswer in English."
    # theme went with the top-level keys, not into the table
    assert tomllib.loads(text)["system_prompts"].keys() == {"terse", "code review"}


def test_none_removes_a_key_and_a_new_file_is_made():
    update_config_file({"theme": "dracula", "system_prompt": "Hi."}, tables={"system_prompts": {"a b": "x"}})
    assert load_config() == Config(theme="dracula", system_prompt="Hi.", system_prompts={"a b": "x"})
    update_config_file({"system_prompt": None}, tables={"system_prompts": {"a b": None}})
    config = load_config()
    assert config.system_prompt is None and config.system_prompts == {} and config.theme == "dracula"
    assert "Hi." not in paths.config_path().read_text()


def test_a_file_that_is_not_valid_toml_is_left_alone():
    path = paths.config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("temperature = = 1\n# keep me\n")
    with pytest.raises(ConfigError, match="not valid TOML; not changed"):
        update_config_file({"theme": "nord"})
    assert path.read_text() == "temperature = = 1\n# keep me\n"


def test_a_layout_it_cannot_edit_is_refused_not_broken():
    """Presets written as an inline table: adding a [system_prompts] header would break the
    file, so the change is refused and the file stays as it was."""
    path = paths.config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    original = 'system_prompts = { terse = "x" }\n'
    path.write_text(original)
    with pytest.raises(ConfigError, match="not changed"):
        update_config_file(tables={"system_prompts": {"new": "y"}})
    assert path.read_text() == original


def test_a_bad_value_is_refused_before_the_file_changes():
    path = paths.config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("temperature = 0.3\n")
    with pytest.raises(ConfigError, match="temperature must be within"):
        update_config_file({"temperature": 9.0})
    assert path.read_text() == "temperature = 0.3\n"


def test_the_write_is_atomic_keeps_the_mode_and_a_symlink(tmp_path):
    target = tmp_path / "real" / "config.toml"
    target.parent.mkdir()
    target.write_text("budget_mb = 64\n")
    os.chmod(target, 0o600)
    link = tmp_path / "link.toml"
    link.symlink_to(target)
    update_config_file({"theme": "nord"}, path=link)
    assert link.is_symlink() and load_config(target) == Config(budget_mb=64, theme="nord")
    assert target.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in target.parent.iterdir()) == ["config.toml"]  # no temporary left


def test_edit_text_keeps_a_file_without_a_final_newline():
    assert edit_text("model = 'x'", {"theme": "nord"}) == "model = 'x'\ntheme = \"nord\"\n"
    assert edit_text("", {}, {"system_prompts": {"q": "1"}}) == '[system_prompts]\nq = "1"\n'


def test_awkward_names_and_prompts_round_trip():
    prompt = 'Quote " backslash \\ newline\n tab\t del\x7f é'
    update_config_file({"system_prompt": prompt}, tables={"system_prompts": {'he said "hi"': prompt, "é": "x"}})
    config = load_config()
    assert config.system_prompt == prompt and config.system_prompts == {'he said "hi"': prompt, "é": "x"}
    save_config(config)  # the whole-file writer knows the table too
    assert load_config() == config


@pytest.mark.parametrize("text, error", [
    ('[system_prompts]\n"" = "x"\n', "must not be empty"),
    ('[system_prompts]\nx = 1\n', "must be a string"),
    ('system_prompts = "x"\n', "system_prompts must be dict"),
    ('theme = ""\n', "theme must not be empty"),
])
def test_bad_presets_and_themes_name_the_key(text, error):
    path = paths.config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    with pytest.raises(ConfigError, match=error):
        load_config()
