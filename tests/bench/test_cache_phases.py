"""`ds4tui bench cache`'s phases of a hit: a forward or tokenization inside the restore (the
message's first chunk run alongside the read) is reported inside it, not counted twice."""

import time
from types import SimpleNamespace

from ds4tui.bench.cache_bench import _PhaseTimers


class Fake:
    """The few objects _PhaseTimers wraps, with calls that take known times."""

    def __init__(self) -> None:
        self.model = SimpleNamespace(forward=lambda *a, **k: time.sleep(0.02),
                                     tokenizer=SimpleNamespace(encode=lambda text: time.sleep(0.005) or [1]))
        store = SimpleNamespace(lookup=lambda *a: time.sleep(0.001) or [])

        def restore_longest(*args):
            store.lookup()
            time.sleep(0.01)  # the read
            self.model.tokenizer.encode("rest")  # the suffix, tokenized for the chunk run alongside
            self.model.forward()
            return 100

        self.ctl = SimpleNamespace(moves=SimpleNamespace(check_fit=lambda *a: None),
                                   checkpoints=SimpleNamespace(store=store, restore_longest=restore_longest,
                                                               restore_titled=lambda *a: None))


def test_calls_inside_the_restore_are_reported_inside_it():
    fake = Fake()
    timers = _PhaseTimers(fake.ctl, fake.model)
    t0 = time.perf_counter()
    fake.ctl.checkpoints.restore_longest()
    restore_ms = (time.perf_counter() - t0) * 1000.0
    fake.model.forward()  # a forward after the restore (the rest of a longer message)
    send_ms = (time.perf_counter() - t0) * 1000.0
    timers.remove()
    phases = timers.phases(send_ms, restore_ms, None)
    assert 20 <= phases["forward"] <= send_ms - restore_ms  # only the one after the restore
    assert 20 <= phases["forward_in_restore"] <= restore_ms
    assert 5 <= phases["tokenize_in_restore"] <= restore_ms and phases["tokenize"] == 0
    assert phases["lookup"] >= 1
    # The phases add up to the send time (the ones inside the restore are not added).
    summed = sum(v for k, v in phases.items() if k not in _PhaseTimers.INSIDE)
    assert abs(summed - send_ms) < 1e-6
    assert fake.ctl.checkpoints.restore_longest.__name__ == "restore_longest"  # unwrapped again
