"""The time-based rules of the watcher and the store on a driven clock, without waiting: the hang rule
(flag, then stop), the vanished-rank rule, the grace period of a stop, and the lock retry's backoff."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy.exc import OperationalError

from runner.hardware import DeviceSample
from runner.watch.follow import WatchOptions, vanished_too_long
from runner.watch.procs import wait_in_grace
from runner.watch.sampling import HangRule
from store.engine import StoreError, retry_delays, retry_locked


class Clock:
    """A clock the test moves; ``sleep`` moves it too (and records each pause)."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def reading(t: float, rank: int, util: float) -> DeviceSample:
    return DeviceSample(t, "box", "rank", rank, f"rank {rank}", util, None, None, None, None, None, "test", None)


def idle(t: float) -> list[DeviceSample]:
    return [reading(t, 0, 0.5)]


def busy(t: float) -> list[DeviceSample]:
    return [reading(t, 0, 95.0)]


def test_the_hang_rule_flags_after_hang_after_and_stops_hang_after_later() -> None:
    clock = Clock()
    rule = HangRule(hang_after_s=10.0, started_at=clock.now, clock=clock, check_every_s=1.0)
    last_event = clock.now + 2.0
    clock.now = last_event + 9.5
    assert rule.check(last_event, False, idle(clock.now)) is None  # 9.5 s without progress: not yet
    clock.now += 0.4
    assert rule.check(last_event, False, idle(clock.now)) is None, "checked 0.4 s ago: not due"
    clock.now += 0.6
    event = rule.check(last_event, False, idle(clock.now))
    assert event is not None and event["since_progress_s"] == 10.5 and event["idle"] == ["rank:0"]
    assert rule.should_stop(last_event, False) is None, "just flagged"
    clock.now += 9.9
    assert rule.check(last_event, False, idle(clock.now)) is None, "one flag per episode"
    assert rule.should_stop(last_event, False) is None
    clock.now += 0.1
    reason = "hang: no progress for 20 s (no event from the trainer, every device idle)"
    assert rule.should_stop(last_event, False) == reason
    assert rule.reason == reason
    assert rule.should_stop(last_event, False) is None, "the stop is decided once"


def test_an_event_ends_the_hang_episode_and_its_stop() -> None:
    clock = Clock()
    rule = HangRule(hang_after_s=5.0, started_at=clock.now, clock=clock)
    clock.now += 6.0
    assert rule.check(None, False, idle(clock.now)) is not None, "before the first event: from the launch"
    clock.now += 1.0
    phase = clock.now  # rank 0 says it saves, evaluates, loads: an event, so progress
    assert rule.check(phase, False, idle(clock.now)) is None and rule.flagged is None, "an event came"
    clock.now += 5.0
    assert rule.should_stop(phase, False) is None, "the episode is over: nothing to stop"
    assert rule.check(phase, False, idle(clock.now)) is not None, "a new episode, 5 s after that event"


def test_one_rank_working_while_the_others_wait_is_not_a_hang() -> None:
    """Rank 0 tokenizes (70.7% CPU) for 18 s, no step, while rank 1 waits at 0%: with --hang-after 6 the
    run goes on, and the limit counts from rank 0's last busy reading once it too is idle."""
    clock = Clock()
    rule = HangRule(hang_after_s=6.0, started_at=clock.now, clock=clock)
    recent: list[DeviceSample] = []
    for _ in range(18):
        clock.now += 1.0
        recent += [reading(clock.now, 0, 70.7), reading(clock.now, 1, 0.0)]
        assert rule.check(None, False, recent) is None, f"{clock.now - 1000:.0f} s: rank 0 works"
        assert rule.should_stop(None, False) is None
    busy_until = clock.now
    for _ in range(5):
        clock.now += 1.0
        recent += [reading(clock.now, 0, 0.0), reading(clock.now, 1, 0.0)]
        assert rule.check(None, False, recent) is None, "idle for less than the limit"
    clock.now += 1.0
    recent += [reading(clock.now, 0, 0.0), reading(clock.now, 1, 0.0)]
    event = rule.check(None, False, recent)
    assert event is not None and event["last_progress"] == busy_until and event["since_progress_s"] == 6.0


def test_busy_devices_or_an_ended_run_are_never_a_hang() -> None:
    clock = Clock()
    rule = HangRule(hang_after_s=5.0, started_at=clock.now, clock=clock)
    for _ in range(60):
        clock.now += 1.0
        assert rule.check(None, False, busy(clock.now)) is None, "a collective spinning at 95%"
    clock.now += 1.0
    assert rule.check(None, True, idle(clock.now)) is None, "the run ended"
    assert rule.should_stop(None, True) is None


def test_the_vanished_rank_rule() -> None:
    assert not vanished_too_long(None, None, 1000.0, 60.0), "nothing vanished"
    assert not vanished_too_long(100.0, 90.0, 159.9, 60.0)
    assert vanished_too_long(100.0, 90.0, 160.0, 60.0)
    assert vanished_too_long(100.0, None, 160.0, 60.0), "no step at all"
    assert not vanished_too_long(100.0, 120.0, 500.0, 60.0), "a step came after: the run goes on"


def test_watch_options_decide_the_forced_stops_defaults() -> None:
    options = WatchOptions()
    assert (options.vanished_after_s, options.forced_grace_s, options.hang_stop_grace_s) == (60.0, 5.0, 10.0)
    assert options.hang_check_s == 1.0 and options.grace_s == 30.0 and options.hang_after_s == 300.0


def test_the_grace_period_ends_when_nothing_is_left() -> None:
    clock = Clock()
    checks = iter([True, True, False])
    assert wait_in_grace(lambda: next(checks), 30.0, poll_s=0.5, clock=clock, sleep=clock.sleep)
    assert clock.slept == [0.5, 0.5]


def test_the_grace_period_runs_out_on_the_clock() -> None:
    clock = Clock()
    looks: list[float] = []

    def left() -> bool:
        looks.append(clock.now)
        return True

    assert not wait_in_grace(left, 3.0, poll_s=0.5, clock=clock, sleep=clock.sleep)
    assert len(looks) == 6 and clock.now == 1003.0, "every 0.5 s for 3 s, then the caller kills what is left"


def test_a_second_request_cuts_the_grace_period_short() -> None:
    clock = Clock()
    now = threading.Event()

    def left() -> bool:
        if clock.now >= 1002.0:
            now.set()  # the second Ctrl-C, 2 s into a 600 s grace
        return True

    assert not wait_in_grace(left, 600.0, kill_now=now, poll_s=1.0, clock=clock, sleep=clock.sleep)
    assert clock.now == 1003.0


def locked() -> OperationalError:
    return OperationalError("INSERT ...", {}, Exception("database is locked"))


def test_the_lock_retry_backs_off_and_succeeds_when_the_lock_goes() -> None:
    clock = Clock()
    tries = iter([locked(), locked(), locked(), locked(), locked(), locked(), None])

    def call() -> str:
        exc = next(tries)
        if exc is not None:
            raise exc
        return "written"

    assert retry_locked(call, "sqlite:///x", 120.0, clock=clock, sleep=clock.sleep) == "written"
    assert clock.slept == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0]


def test_the_lock_retry_gives_up_after_the_lock_timeout() -> None:
    clock = Clock()

    def call() -> None:
        raise locked()

    with pytest.raises(StoreError, match=r"still locked by another program after 2 s \(FTUI_DB_LOCK_TIMEOUT\)"):
        retry_locked(call, "sqlite:///x", 2.0, clock=clock, sleep=clock.sleep)
    assert clock.now == pytest.approx(1002.0), "the last pause is cut to what is left of the budget"
    assert clock.slept[-1] == pytest.approx(2.0 - sum(clock.slept[:-1]))


def test_the_lock_retry_never_retries_another_error() -> None:
    clock = Clock()

    def call() -> None:
        raise OperationalError("SELECT", {}, Exception("no such table: runs"))

    with pytest.raises(OperationalError):
        retry_locked(call, "sqlite:///x", 120.0, clock=clock, sleep=clock.sleep)
    assert clock.slept == []


def test_retry_delays_double_up_to_a_second() -> None:
    delays = retry_delays()
    assert [next(delays) for _ in range(8)] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0]
