"""Receipts (issue 17.3): what a granted request waited through, as the engine saw it.

The fake supervisor reports every load as taking 0.25 s (``FakeSupervisor.ready``).
"""

from __future__ import annotations

import pytest

from routerpanel.router.receipts import Receipt
from tests.support.engine import Harness, engine_config

pytest_plugins = ("tests.support.engine",)


@engine_config("a", "b", models_max=1)
async def test_a_request_that_evicts_and_loads_gets_the_load_and_the_victim(h: Harness) -> None:
    await h.warm("a")
    task = h.acquire("b", request_id="r-b")
    await h.idle()
    h.clock.advance(2)
    await h.exit("a")  # the victim exits, b spawns
    h.sup.ready("b")
    await h.idle()
    assert task.result().receipt == Receipt(2.0, 0.25, ("a",), True)


@engine_config("a", "b", models_max=1)
async def test_waiters_sharing_the_load_see_it_but_only_its_cause_is_charged(
    h: Harness,
) -> None:
    first = h.acquire("a", request_id="r1")
    await h.idle()
    h.clock.advance(1)
    second = h.acquire("a", request_id="r2")
    await h.idle()
    h.sup.ready("a")
    await h.idle()
    assert first.result().receipt == Receipt(1.0, 0.25, (), True)
    assert second.result().receipt == Receipt(0.0, 0.25, (), False)


@engine_config("a", "b", models_max=1)
async def test_a_request_for_a_loaded_model_has_no_load(h: Harness) -> None:
    await h.warm("a")
    task = h.acquire("a")
    await h.idle()
    assert task.result().receipt == Receipt(0.0, 0.0, (), False)


@engine_config("a", "b", models_max=1)
async def test_an_eviction_for_a_request_that_left_is_charged_to_nobody(h: Harness) -> None:
    await h.warm("a")
    gone = h.acquire("b", request_id="r-gone")
    await h.idle()
    gone.cancel()
    await h.idle()
    later = h.acquire("b", request_id="r-later")
    await h.idle()
    await h.exit("a")
    h.sup.ready("b")
    await h.idle()
    with pytest.raises(BaseException):  # noqa: B017 (cancelled)
        gone.result()
    receipt = later.result().receipt
    assert receipt.load == 0.25 and receipt.caused_load
    assert receipt.evicted == ()  # the eviction was for r-gone, who left
