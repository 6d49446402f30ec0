"""Reply text from token bytes: whole characters, stop strings across tokens, batched UI events."""

from __future__ import annotations

from ds4tui.chat.events import Done, PrefillProgress, TokenText
from ds4tui.chat.streaming import EventBatcher, ReplyStream


def test_multibyte_characters_split_across_tokens_are_emitted_whole():
    stream = ReplyStream()
    euro = "€".encode()  # 3 bytes
    assert stream.feed(b"a" + euro[:1]) == "a"
    assert stream.feed(euro[1:2]) == ""
    assert stream.feed(euro[2:] + b"b") == "€b"
    assert stream.finish() == "" and stream.text == "a€b"


def test_a_dangling_partial_character_becomes_one_replacement_at_the_end():
    stream = ReplyStream()
    assert stream.feed("ok ".encode() + "é".encode()[:1]) == "ok "
    assert stream.finish() == "\ufffd"


def test_drop_partial_drops_a_character_cut_by_the_end():
    stream = ReplyStream(drop_partial=True)
    assert stream.feed("ok ".encode() + "é".encode()[:1]) == "ok "
    assert stream.finish() == "" and stream.text == "ok "
    cut = ReplyStream(drop_partial=True)
    assert cut.feed("🙂".encode()[:3]) == "" and cut.finish() == "" and cut.text == ""
    # bytes that cannot start or continue any character stay visible as U+FFFD
    bad = ReplyStream(drop_partial=True)
    assert bad.feed(b"a\xffb") + bad.finish() == "a\ufffdb"


def test_stop_string_across_tokens_is_cut_and_never_shown():
    stream = ReplyStream(["<|im_end|>"])
    shown = [stream.feed(b"Hi <|im"), stream.feed(b"_en"), stream.feed(b"d|> junk")]
    assert "".join(shown) == "Hi " and stream.stopped and stream.text == "Hi "
    assert stream.feed(b"more") == "" and stream.finish() == ""


def test_held_back_prefix_is_released_when_it_turns_out_not_to_be_a_stop():
    stream = ReplyStream(["STOP"])
    assert stream.feed(b"go ST") == "go "
    assert stream.feed(b"AY") == "STAY"
    assert not stream.stopped


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_batcher_joins_tokens_and_keeps_order():
    out, clock = [], FakeClock()
    batch = EventBatcher(out.append, interval=0.05, clock=clock)
    batch(TokenText("a"))  # the first text goes straight out
    batch(TokenText("b"))
    batch(TokenText("c"))
    assert out == [TokenText("a")]
    clock.now = 0.06
    batch(TokenText("d"))
    assert out[1:] == [TokenText("bcd")]
    batch(TokenText("e"))
    progress = PrefillProgress(2, 4, 1.0, None)
    batch(progress)  # anything else flushes first and passes at once
    done = Done(5, 1.0, 4, 1.0, 1.0, 9, "eos")
    batch(done)
    assert out[2:] == [TokenText("e"), progress, done]
