"""Leaderboard on a real Redis: ordering with ties, absent members, empty boards,
bad input (typed errors, nothing written) and a 100k-member board."""
from __future__ import annotations

import math
import random

import pytest

from emqfast.core.errors import EmqError, InvalidInput, RangeError
from emqfast.core.keys import leaderboard_key
from emqfast.facade.leaderboard import Entry, Leaderboard


@pytest.fixture
def board(r, qname):
    b = Leaderboard(r, qname)
    yield b
    b.clear()


def expected_order(scores):
    """The documented order, computed independently: score desc, then member bytes asc."""
    return sorted(scores.items(), key=lambda kv: (-kv[1], kv[0].encode("utf-8")))


def test_key_follows_the_emq_scheme_and_validates_names(r, qname):
    assert leaderboard_key(qname) == f"emq:{{lb:{qname}}}:board"
    b = Leaderboard(r, qname)
    b.set("ada", 1)
    assert r.exists(f"emq:{{lb:{qname}}}:board") == 1
    for bad in ("", "a{b", "a}b", 7, None):
        with pytest.raises(InvalidInput):
            Leaderboard(r, bad)
    b.clear()


def test_empty_board(board):
    assert board.size() == 0
    assert board.top(5) == []
    assert board.top(0) == []
    assert board.rank("nobody") is None
    assert board.score("nobody") is None
    assert board.around("nobody", 3) == []
    assert board.remove("nobody") is False


def test_top_rank_and_scores(board):
    board.set("ada", 97)
    board.set("linus", 88.5)
    board.set("grace", 42)
    assert board.top(2) == [Entry(1, "ada", 97.0), Entry(2, "linus", 88.5)]
    assert board.top(10) == [Entry(1, "ada", 97.0), Entry(2, "linus", 88.5),
                             Entry(3, "grace", 42.0)]
    assert [board.rank(m) for m in ("ada", "linus", "grace")] == [1, 2, 3]
    assert board.size() == 3
    board.set("grace", 99)  # set overwrites, it does not add
    assert board.rank("grace") == 1 and board.size() == 3
    assert board.score("grace") == 99.0


def test_ties_rank_by_member_ascending_and_all_reads_agree(board):
    scores = {"zoe": 80, "adam": 80, "mia": 80, "bob": 95, "carl": 80, "eve": 10}
    board.set_many(scores)
    want = expected_order(scores)
    assert [(e.member, e.score) for e in board.top(10)] == [(m, float(s)) for m, s in want]
    assert [e.member for e in board.top(10)] == ["bob", "adam", "carl", "mia", "zoe", "eve"]
    for i, (member, _) in enumerate(want, start=1):
        assert board.rank(member) == i
    # around agrees with top on the ranks and the order
    assert board.around("mia", 1) == [Entry(3, "carl", 80.0), Entry(4, "mia", 80.0),
                                      Entry(5, "zoe", 80.0)]


def test_zero_and_negative_scores_round_trip(board):
    board.set_many({"a": 0, "b": -0.0, "c": -3.25, "d": 1e-300})
    top = board.top(4)
    assert [e.member for e in top] == ["d", "a", "b", "c"]
    assert [math.copysign(1, e.score) for e in top[:3]] == [1, 1, 1]  # no -0.0 leaks out
    assert board.score("c") == -3.25


def test_incr(board):
    assert board.incr("ada", 5) == 5.0  # absent member starts from 0
    assert board.incr("ada", 2.5) == 7.5
    assert board.incr("ada", -10) == -2.5
    board.set("bob", 1)
    assert board.incr("bob") == 2.0
    assert board.top(2) == [Entry(1, "bob", 2.0), Entry(2, "ada", -2.5)]


def test_remove(board):
    board.set_many({"a": 3, "b": 2, "c": 1})
    assert board.remove("b") is True
    assert board.remove("b") is False
    assert board.rank("b") is None and board.rank("c") == 2 and board.size() == 2


def test_around_clips_at_both_ends(board):
    board.set_many({f"m{i:02d}": 100 - i for i in range(10)})  # m00 rank 1 .. m09 rank 10
    assert [e.rank for e in board.around("m00", 2)] == [1, 2, 3]
    assert [e.rank for e in board.around("m09", 2)] == [8, 9, 10]
    mid = board.around("m05", 2)
    assert [(e.rank, e.member) for e in mid] == [(4, "m03"), (5, "m04"), (6, "m05"),
                                                 (7, "m06"), (8, "m07")]
    assert board.around("m05", 0) == [Entry(6, "m05", 95.0)]
    assert len(board.around("m05", 100)) == 10
    assert board.around("absent", 2) == []


def test_bytes_and_unicode_members(board):
    board.set(b"\xff\xfe", 5)       # not UTF-8: returned with surrogateescape
    board.set("zoë", 5)
    board.set(b"ada", 5)
    top = board.top(3)
    not_utf8 = b"\xff\xfe".decode("utf-8", "surrogateescape")
    assert [e.member for e in top] == ["ada", "zoë", not_utf8]
    assert board.rank(top[2].member) == 3   # the returned str can be passed back
    assert board.rank(b"\xff\xfe") == 3


@pytest.mark.parametrize("member", [1, None, 2.5, ("a",), "", b"", "\ud800"])
def test_bad_members_raise_typed_errors_and_write_nothing(board, r, member):
    board.set("keep", 1)
    before = r.dump(board.key)
    calls = [lambda: board.set(member, 1), lambda: board.incr(member, 1),
             lambda: board.set_many({"ok": 2, member: 1}),  # validated before anything is sent
             lambda: board.rank(member), lambda: board.score(member),
             lambda: board.around(member, 1), lambda: board.remove(member)]
    for call in calls:
        with pytest.raises(InvalidInput):
            call()
    assert r.dump(board.key) == before


@pytest.mark.parametrize("score,error", [
    (float("nan"), RangeError), (float("inf"), RangeError), (float("-inf"), RangeError),
    (2 ** 53 + 1, RangeError), ("12", InvalidInput), (None, InvalidInput), (True, InvalidInput),
])
def test_bad_scores_raise_typed_errors_and_write_nothing(board, r, score, error):
    board.set("keep", 1)
    before = r.dump(board.key)
    with pytest.raises(error):
        board.set("x", score)
    with pytest.raises(error):
        board.incr("keep", score)
    with pytest.raises(error):
        board.set_many({"a": 1, "b": score})  # validated before anything is sent
    assert r.dump(board.key) == before
    assert issubclass(error, EmqError)


def test_bad_counts(board):
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises(InvalidInput):
            board.top(bad)
        with pytest.raises(InvalidInput):
            board.around("a", bad)
    with pytest.raises(InvalidInput):
        board.set_many([("a", 1)])


def test_hundred_thousand_members(board):
    rng = random.Random(20240105)
    # scores from a small range: thousands of ties to order by member
    scores = {f"learner-{rng.getrandbits(40):010x}": rng.randint(0, 500) for _ in range(100_000)}
    assert board.set_many(scores) == len(scores)
    assert board.size() == len(scores)

    want = expected_order(scores)
    rank_of = {m: i for i, (m, _) in enumerate(want, start=1)}
    assert board.top(25) == [Entry(i, m, float(s)) for i, (m, s) in enumerate(want[:25], start=1)]

    for member in rng.sample(sorted(scores), 50) + [want[0][0], want[-1][0]]:
        assert board.rank(member) == rank_of[member]
    assert board.rank("learner-absent") is None

    probe = want[61_234][0]
    lo, hi = 61_234 - 5, 61_234 + 5
    assert board.around(probe, 5) == [Entry(i + 1, m, float(s))
                                      for i, (m, s) in enumerate(want[lo:hi + 1], start=lo)]
    last = want[-1][0]
    assert board.around(last, 3) == [Entry(i + 1, m, float(s)) for i, (m, s) in
                                     enumerate(want[-4:], start=len(want) - 4)]
