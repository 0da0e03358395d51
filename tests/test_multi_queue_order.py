"""The claim order of a many-queue worker, without Redis (emqfast.worker.queue_order)."""
from __future__ import annotations

import random
from collections import Counter

import pytest

from emqfast.core.errors import InputTypeError, InvalidInput
from emqfast.worker.queue_order import QueueOrder, check_order


def _serving(order: QueueOrder) -> QueueOrder:
    for i in range(len(order.ready)):
        order.join(i)
    return order


def test_strict_claims_only_below_queues_that_are_neither_ready_nor_holding():
    order = _serving(QueueOrder(3))
    none = [False, False, False]
    assert [order.may_claim(i, none) for i in range(3)] == [True, False, False]
    order.set_ready(0, False)  # the high queue's claim came back empty
    assert [order.may_claim(i, none) for i in range(3)] == [True, True, False]
    # it still holds claimed jobs: they start first, nothing below claims meanwhile
    assert not order.may_claim(1, [True, False, False])
    assert not order.may_start(1, [True, False, False]) and order.may_start(0, [True] * 3)
    order.set_ready(1, False)
    assert order.may_claim(2, none)
    order.set_ready(0, True)  # its marker fired: the lower queues wait again
    assert not order.may_claim(1, none) and not order.may_claim(2, none)
    order.leave(0)  # its loop ended (burst: idle): no longer in the way
    assert order.may_claim(1, none)


def test_weighted_draws_each_round_in_proportion_among_ready_queues():
    order = _serving(QueueOrder(3, "weighted", [6, 3, 1], rng=random.Random(11)))
    wins: Counter = Counter()
    for _ in range(10_000):
        winner = [i for i in range(3) if order.may_claim(i, [False] * 3)]
        assert len(winner) == 1  # one queue per round
        wins[winner[0]] += 1
        assert order.claimed(winner[0])
    assert [round(wins[i] / 10_000, 2) for i in range(3)] == pytest.approx([0.6, 0.3, 0.1],
                                                                           abs=0.02)
    order.set_ready(0, False)  # nothing ready there: the others share its rounds
    assert {order.draw() for _ in range(200)} == {1, 2}
    order.set_ready(1, False)
    order.set_ready(2, False)
    # none ready (all idle between beats): each may claim, which is how an idle queue's
    # loop gets back to its marker and is woken (ready) when work comes
    assert order.draw() is None and all(order.may_claim(i, [False] * 3) for i in range(3))


def test_a_round_ends_when_its_queue_goes_idle():
    order = _serving(QueueOrder(2, "weighted", [1, 1], rng=random.Random(1)))
    turn = order.draw()
    assert turn is not None
    order.set_ready(turn, False)
    assert order.turn is None


def test_bad_orders_and_weights_are_typed_errors():
    assert check_order("strict", None, 3) == [1, 1, 1]
    assert check_order("weighted", (2, 1), 2) == [2, 1]
    with pytest.raises(InvalidInput):
        check_order("fifo", None, 2)
    with pytest.raises(InvalidInput):
        check_order("strict", [1, 2], 2)
    with pytest.raises(InputTypeError):
        check_order("weighted", "21", 2)
    with pytest.raises(InvalidInput):
        check_order("weighted", [1, -1], 2)
    with pytest.raises(InvalidInput):  # check_int's answer for a non-int
        check_order("weighted", [1, 1.5], 2)
