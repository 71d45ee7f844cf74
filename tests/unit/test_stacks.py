"""Where each rank is, from faulthandler's own dumps (``runner.spec.stacks``), and a collective timeout in
a rank's log (``runner.watch.crash``). The dumps are written by faulthandler itself, in this process."""

from __future__ import annotations

import faulthandler
import threading
from pathlib import Path

from runner.spec import events as ev
from runner.spec import stacks
from runner.watch.crash import collective_timeout, describe


def dump_while_waiting(tmp_path: Path, from_worker: bool) -> str:
    """A real dump of every thread: one thread waits in ``waits_in_a_helper_thread``; the dump is written
    by this test's thread (a rank's main thread), or (``from_worker``) by a worker while this thread
    waits in ``join``."""
    out = tmp_path / "dump.txt"
    release = threading.Event()

    def waits_in_a_helper_thread() -> None:
        release.wait()

    helper = threading.Thread(target=waits_in_a_helper_thread, daemon=True)
    helper.start()
    with open(out, "w") as fh:
        if from_worker:
            worker = threading.Thread(target=lambda: faulthandler.dump_traceback(fh, all_threads=True))
            worker.start()
            worker.join()
        else:
            faulthandler.dump_traceback(fh, all_threads=True)
    release.set()
    helper.join()
    return out.read_text()


def test_the_main_thread_of_a_real_dump_is_found_in_our_code(tmp_path: Path) -> None:
    threads = stacks.parse_dump(dump_while_waiting(tmp_path, from_worker=False))
    assert len(threads) >= 2 and sum(t.current for t in threads) == 1
    main = stacks.main_thread(threads, stacks.thread_ident(threading.get_ident()))
    assert main is not None and main.current, "the main thread wrote this dump"
    place = stacks.where(main)
    assert place.startswith("dump_while_waiting (tests/unit/test_stacks.py:"), place


def test_a_dump_written_from_another_thread_still_names_the_main_thread(tmp_path: Path) -> None:
    text = dump_while_waiting(tmp_path, from_worker=True)
    threads = stacks.parse_dump(text)
    main = stacks.main_thread(threads, stacks.thread_ident(threading.get_ident()))
    assert main is not None and not main.current, "a worker wrote it: the main thread is not 'Current'"
    assert stacks.where(main).startswith("dump_while_waiting (tests/unit/test_stacks.py:")
    assert stacks.rank_where(text, main.ident) == stacks.where(main)
    helper = next(t for t in threads if any(f.function == "waits_in_a_helper_thread" for f in t.frames))
    assert not helper.is_main, "started by threading: never taken for the main thread"


def test_a_rank_in_a_collective_is_named_by_the_collective_at_our_line() -> None:
    """The shape faulthandler writes for a rank blocked in ``dist.all_reduce`` (frames innermost first)."""
    site = "/usr/lib/python3.11/site-packages"
    dump = (f'Current thread 0x00007f0000000001 (most recent call first):\n'
            f'  File "{site}/torch/distributed/distributed_c10d.py", line 2501 in all_reduce\n'
            f'  File "{site}/torch/distributed/c10d_logger.py", line 81 in wrapper\n'
            f'  File "{stacks.PROJECT_ROOT}/runner/rank/loop.py", line 412 in step_stats\n'
            f'  File "{stacks.PROJECT_ROOT}/runner/rank/trainer.py", line 44 in main\n'
            f'  File "<frozen runpy>", line 88 in _run_code\n')
    assert stacks.rank_where(dump) == "all_reduce (runner/rank/loop.py:412)"
    assert stacks.rank_where(stacks.header(0, 12, 1)) is None, "a header alone: no dump"


def test_the_summary_groups_ranks_at_the_same_place_and_names_silent_ones() -> None:
    at = "all_reduce (runner/rank/loop.py:412)"
    line = stacks.summary({0: "tokenize (runner/data/blocks.py:80)", 1: at, 2: at, 3: at, 5: at, 4: None})
    assert line == ("rank 0 in tokenize (runner/data/blocks.py:80); ranks 1-3, 5 in all_reduce "
                    "(runner/rank/loop.py:412); rank 4: no stacks (did not answer)")


def test_only_a_process_that_registered_is_named_by_its_stacks_file(tmp_path: Path) -> None:
    path = stacks.stacks_file(tmp_path, 1)
    assert stacks.registered(path) is None, "no file: never signalled"
    path.parent.mkdir()
    path.write_text("")
    assert stacks.registered(path) is None, "no header yet: the handler may not be registered"
    path.write_text(stacks.header(1, 4242, 0x7F00AB) + "Thread 0x1 (most recent call first):\n")
    assert stacks.registered(path) == (4242, "0x00000000007f00ab")


GLOO = ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting "
        "1800000ms for recv operation to complete")
NCCL = ("[rank1]:[E ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=7, OpType=ALLREDUCE, NumelIn=1, Timeout(ms)=600000) ran for 600027 milliseconds "
        "before timing out.")


def test_a_collective_timeout_in_a_rank_log_is_found_and_named_in_the_reason(tmp_path: Path) -> None:
    log = ev.rank_log(tmp_path, 1)
    log.parent.mkdir()
    log.write_text("step 3\nTraceback (most recent call last):\n  File x\n" + GLOO + "\n")
    assert collective_timeout(tmp_path, 1) == GLOO
    assert collective_timeout(tmp_path, 0) is None, "no log"
    (tmp_path / ev.LAUNCHER_LOG).write_text(
        "Root Cause (first observed failure):\n[0]:\n  rank      : 1 (local_rank: 1)\n  exitcode  : -6 (pid: 77)\n")
    log.write_text(NCCL + "\nterminate called after throwing an instance of 'c10::DistBackendError'\n")
    reason = describe(tmp_path)
    assert reason == f"rank 1 (pid 77) was killed by SIGABRT; collective timeout (a hang): {NCCL}"


def test_a_run_folder_that_takes_no_stacks_file_leaves_the_rank_running_and_unasked(tmp_path: Path) -> None:
    from runner.rank.rank_log import dump_stacks_on_signal

    (tmp_path / stacks.STACKS_DIR).write_text("a file where the folder goes")  # no folder can be made
    dump_stacks_on_signal(tmp_path, 0)  # no exception: the rank goes on
    assert stacks.registered(stacks.stacks_file(tmp_path, 0)) is None, "no header: the watcher never asks it"
