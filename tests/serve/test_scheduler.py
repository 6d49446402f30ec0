"""The baton (serve/scheduler.py) with stand-in sessions: one thread runs at a time, decodes
of every running request go out as one step, a prefill advances one chunk per step, and a
request entering or leaving mid-way neither stalls nor mixes the others."""

from __future__ import annotations

import threading

import torch

from ds4tui.serve.scheduler import Scheduler


class Recorder:
    """The step function: checks that nobody else runs meanwhile, answers token + 1000 * session id."""

    def __init__(self) -> None:
        self.inside = 0
        self.steps: list[list[int]] = []
        self.log: list[str] = []
        self.lock = threading.Lock()

    def enter(self, what: str) -> None:
        with self.lock:
            self.inside += 1
            assert self.inside == 1, f"two threads ran at once ({what})"
            self.log.append(what)

    def leave(self) -> None:
        with self.lock:
            self.inside -= 1

    def __call__(self, sessions, tokens):
        self.enter("step")
        try:
            self.steps.append(sorted(s for s in sessions))
            return [torch.tensor([float(t + 1000 * s)]) for s, t in zip(sessions, tokens)]
        finally:
            self.leave()


def _request(sched: Scheduler, rec: Recorder, sid: int, chunks: int, tokens: int, out: dict) -> None:
    with sched.running():
        for c in range(chunks):
            sched.between()
            rec.enter(f"prefill {sid}.{c}")
            rec.leave()
        got = []
        for t in range(tokens):
            rec.enter(f"sample {sid}.{t}")
            rec.leave()
            got.append(float(sched.decode(sid, t)[0]))
        out[sid] = got


def _run(requests: list[tuple[int, int]]) -> tuple[Recorder, dict]:
    rec = Recorder()
    sched = Scheduler(step=rec)
    out: dict = {}
    threads = [threading.Thread(target=_request, args=(sched, rec, i, c, t, out)) for i, (c, t) in enumerate(requests)]
    with sched.running():  # they all arrive while the engine is busy: they start together
        for th in threads:
            th.start()
        while len(sched._ready) < len(threads):
            threading.Event().wait(0.001)
    for th in threads:
        th.join(timeout=30)
    assert not any(th.is_alive() for th in threads), "a request never got the baton back"
    return rec, out


def test_each_request_gets_its_own_answers():
    rec, out = _run([(0, 6), (0, 6), (0, 6), (0, 6)])
    for sid in range(4):
        assert out[sid] == [t + 1000 * sid for t in range(6)]


def test_decodes_of_all_running_requests_go_out_together():
    rec, _ = _run([(0, 5), (0, 5), (0, 5)])
    assert sum(len(s) for s in rec.steps) == 15
    assert rec.steps == [[0, 1, 2]] * 5


def test_a_long_prefill_advances_a_chunk_per_step_while_others_decode():
    rec, out = _run([(0, 8), (6, 2)])  # request 1 prefills 6 chunks, then decodes
    assert out[0] == [float(t) for t in range(8)]
    # Between two consecutive steps in which request 0 decodes, request 1 runs at most one chunk.
    chunks_between, worst = 0, 0
    for what in rec.log:
        if what.startswith("prefill 1."):
            chunks_between += 1
            worst = max(worst, chunks_between)
        elif what == "step":
            chunks_between = 0
    assert worst == 1
    # and request 0 did not wait for request 1's whole prefill: it decoded during it
    first_chunk = rec.log.index("prefill 1.0")
    last_chunk = rec.log.index("prefill 1.5")
    assert any(w.startswith("sample 0.") for w in rec.log[first_chunk:last_chunk])


def test_requests_arriving_and_leaving_mid_way():
    rec, out = _run([(0, 3), (2, 12), (0, 1), (1, 7)])
    lengths = {0: 3, 1: 12, 2: 1, 3: 7}
    assert out == {sid: [t + 1000.0 * sid for t in range(n)] for sid, n in lengths.items()}
    assert max(len(s) for s in rec.steps) > 1


def test_an_error_in_the_step_reaches_every_request_of_that_step_and_the_next_runs():
    calls = []

    def step(sessions, tokens):
        calls.append(list(sessions))
        if len(calls) == 1:
            raise RuntimeError("boom")
        return [torch.zeros(1) for _ in sessions]

    sched = Scheduler(step=step)
    errors, done = [], []

    def request(sid):
        with sched.running():
            try:
                sched.decode(sid, 0)
            except RuntimeError as exc:
                errors.append((sid, str(exc)))
                return
            done.append(sid)

    t = threading.Thread(target=request, args=(0,))
    t.start()
    t.join(10)
    t2 = threading.Thread(target=request, args=(1,))
    t2.start()
    t2.join(10)
    assert errors == [(0, "boom")] and done == [1]
