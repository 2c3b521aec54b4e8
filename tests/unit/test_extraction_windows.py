"""The windows a session extraction shows the model: ``count`` turns each, ending at every
``count``-th new turn and at the last, the first filled from the turns before."""

from __future__ import annotations

from harbor_pg.extraction.facade import _windows


def test_fewer_new_turns_than_a_window_are_shown_with_the_turns_before() -> None:
    assert _windows([1, 2, 3], [4, 5], 4) == [[2, 3, 4, 5]]


def test_each_new_turn_is_in_a_window_and_the_last_window_is_full() -> None:
    windows = _windows([0], list(range(1, 11)), 4)
    assert windows == [[1, 2, 3, 4], [5, 6, 7, 8], [7, 8, 9, 10]]
    assert sorted({t for w in windows for t in w}) == list(range(1, 11))


def test_no_turns_before_and_a_short_session_gives_one_window_of_what_there_is() -> None:
    assert _windows([], [1, 2], 12) == [[1, 2]]
