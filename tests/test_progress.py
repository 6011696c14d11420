"""Progress on a terminal: a bar per transfer, a status line while cells run, lines above.

The display is driven with a fake clock and a string stream (what it draws is
text); one test runs a real command under a pseudo-terminal and reads the bar
it drew, and one reads the same command's output in a pipe (a CI log): stage
lines, no bar.
"""

from __future__ import annotations

import io
import os
import pty
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from cachetrees import make_generic_tree
from conftest import clean_env, scaled

from artifactd.cli import progress, render

TICK = {"stage": "fetch", "event": "progress"}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _display(tick_s: float = 3600.0) -> tuple[progress.Display, io.StringIO, Clock]:
    out, clock = io.StringIO(), Clock()
    return progress.Display(out, clock=clock, columns=lambda: 200, tick_s=tick_s), out, clock


def _screen(raw: str) -> list[str]:
    """What a terminal shows: each \\r returns to the line's start and overwrites it."""
    lines, current = [], ""
    for part in raw.split("\n"):
        for piece in part.split("\r"):
            current = piece + current[len(piece) :]
        lines.append(current.rstrip())
        current = ""
    return lines


def test_a_transfer_is_a_bar_with_its_rate_and_the_time_left() -> None:
    show, out, clock = _display()
    mib = 1 << 20
    show(
        {"stage": "fetch", "event": "progress", "family": "triton", "bytes": 0, "total": 100 * mib}
    )
    clock.now += 2.0
    show({"stage": "fetch", "event": "progress", "family": "triton", "bytes": 25 * mib,
          "total": 100 * mib})  # fmt: skip
    last = _screen(out.getvalue())[-1]
    assert last.startswith("[fetch] triton  [######------------------]  25%"), last
    assert "25.0 MiB / 100.0 MiB" in last and "12.5 MiB/s" in last and "6s left" in last, last


def test_transfers_side_by_side_are_summed_and_nothing_lingers_after_the_last() -> None:
    show, out, clock = _display()
    for fam in ("triton", "inductor"):
        show({"stage": "fetch", "event": "progress", "family": fam, "bytes": 0, "total": 1000})
    clock.now += 1.0
    show({"stage": "fetch", "event": "progress", "family": "triton", "bytes": 1000, "total": 1000})
    clock.now += 1.0
    show({"stage": "fetch", "event": "progress", "family": "inductor", "bytes": 500, "total": 1000})
    assert "2 layers" not in _screen(out.getvalue())[-1]  # triton is done: one left
    assert "[fetch] inductor" in _screen(out.getvalue())[-1]
    show(
        {"stage": "fetch", "event": "progress", "family": "inductor", "bytes": 1000, "total": 1000}
    )
    assert _screen(out.getvalue())[-1] == "", "a finished transfer's bar stays on screen"


def test_events_print_above_the_status_line_which_is_drawn_again() -> None:
    show, out, _ = _display()
    show({"stage": "fetch", "event": "progress", "family": "triton", "bytes": 1, "total": 10})
    show({"stage": "verify", "event": "start", "family": "triton"})
    screen = _screen(out.getvalue())
    assert screen[-2] == "[verify] start family=triton"
    assert screen[-1].startswith("[fetch] triton  [##")


def test_hostile_counts_draw_a_bar_not_an_error() -> None:
    show, out, _ = _display()
    for done, total in [(-5, 10), ("x", 10), (50, 10), (5, -1), (None, None)]:
        show({"stage": "push", "event": "progress", "family": "f", "bytes": done, "total": total})
    assert "%" in out.getvalue() or "B" in out.getvalue()


def test_running_cells_tick_with_their_elapsed_time_and_the_ticker_stops() -> None:
    show, out, clock = _display(tick_s=0.01)
    for cell in ("0-inductor", "1-triton"):
        show({"stage": "cell", "event": "queued", "cell": cell, "gpus": 0})
    show({"stage": "cell", "event": "start", "cell": "0-inductor", "devices": []})
    ticked = threading.Event()
    clock.now += 125
    original = show.status

    def status(text: str) -> None:
        original(text)
        if "2m05s" in text:
            ticked.set()

    show.status = status  # type: ignore[method-assign]
    assert ticked.wait(scaled(30)), "no redraw while the cell ran"
    assert "[cells] 0/2 done; running 0-inductor 2m05s" in _screen(out.getvalue())[-1]
    show({"stage": "cell", "event": "done", "cell": "0-inductor", "elapsed_ms": 125000})
    ticker = show._ticker
    assert ticker is not None
    ticker.join(scaled(30))
    assert not ticker.is_alive(), "the ticker outlived the last cell"
    assert _screen(out.getvalue())[-1] == ""
    assert "[cell] done cell=0-inductor elapsed_ms=125000" in _screen(out.getvalue())


def test_the_status_line_fits_the_terminal() -> None:
    out = io.StringIO()
    show = progress.Display(out, clock=Clock(), columns=lambda: 40)
    show({"stage": "fetch", "event": "progress", "family": "x" * 80, "bytes": 1, "total": 2})
    assert max(len(line) for line in _screen(out.getvalue())) <= 39


def test_off_a_terminal_progress_is_never_printed_and_json_has_none(
    capsys: pytest.CaptureFixture[str],
) -> None:
    tick = {"stage": "push", "event": "progress", "family": "f", "bytes": 1, "total": 2}
    done = {"stage": "push", "event": "done", "family": "f"}
    for as_json, lines in [(True, False), (False, True), (False, False)]:
        show = render.event_printer(as_json, lines=lines)
        assert not isinstance(show, progress.Display)
        show(tick)
        show(done)
    err = capsys.readouterr().err
    assert "progress" not in err and "[#" not in err
    assert err.count("done") == 2  # the JSON line and the stage line


def _run(argv: list[str], env: dict[str, str], cwd: Path, tty: bool) -> str:
    if not tty:
        done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True,
                              timeout=scaled(300), check=True)  # fmt: skip
        return done.stderr
    leader, follower = pty.openpty()
    try:
        proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=follower)  # fmt: skip
        os.close(follower)
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            chunks.append(chunk)
        assert proc.wait(timeout=scaled(300)) == 0
    finally:
        os.close(leader)
    return b"".join(chunks).decode(errors="replace")


@pytest.mark.slow
def test_a_real_push_draws_a_bar_on_a_terminal_and_stage_lines_in_a_log(tmp_path: Path) -> None:
    tree = make_generic_tree(tmp_path / "caches")
    for i in range(4):  # incompressible, so the push lasts past one progress interval
        (tree / f"big{i}.so").write_bytes(os.urandom(16 << 20))
    env = clean_env({"ARTIFACTD_GENERIC_DIR": str(tree), "HOME": str(tmp_path)})
    harvest = [sys.executable, "-m", "artifactd", "harvest", "--family", "generic", "--store"]
    on_tty = _run([*harvest, f"oci:{tmp_path / 'a'}"], env, tmp_path, tty=True)
    assert "[push] generic  [" in on_tty, on_tty[-2000:]
    assert "%" in on_tty
    in_log = _run([*harvest, f"oci:{tmp_path / 'b'}"], env, tmp_path, tty=False)
    assert "[push] done" in in_log and "[#" not in in_log and "\r" not in in_log, in_log[-2000:]
