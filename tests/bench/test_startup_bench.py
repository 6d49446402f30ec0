"""`ds4tui bench startup`'s harness: the real chat command in a pty, read as it draws."""

import pytest

from ds4tui.bench.startup_bench import time_chat_start


def test_the_chat_paints_takes_keys_and_reports_its_model_in_a_pty():
    marks = time_chat_start("tiny-llama")
    assert set(marks) == {"first_paint_s", "typing_ready_s", "model_ready_s"}
    assert 0 < marks["first_paint_s"] <= marks["typing_ready_s"]
    assert marks["first_paint_s"] <= marks["model_ready_s"]


def test_a_chat_that_cannot_start_is_an_error_not_a_hang(tmp_path):
    with pytest.raises(RuntimeError, match="exited before it was ready"):
        time_chat_start(str(tmp_path / "no-such-model.gguf"))
