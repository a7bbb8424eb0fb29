import orjson
import pytest

from eagle_assets.generation.concurrency import AdaptiveLimiter
from eagle_assets.generation.retry_policy import RetryPolicy
from resources.openrouter.outcomes import Action, RawResponse, classify

OK = {
    "id": "gen-1",
    "provider": "Chutes",
    "choices": [{"finish_reason": "stop", "message": {"content": "hi"}}],
    "usage": {"cost": 0.002, "completion_tokens": 3},
}


def raw(status, body=None, headers=None, err=None):
    data = body if isinstance(body, bytes | type(None)) else orjson.dumps(body)
    return RawResponse(status, data, headers or {}, err)


@pytest.mark.parametrize(
    ("response", "action", "cls"),
    [
        (raw(200, OK), Action.SUCCESS, "ok"),
        (raw(200, b"\n\n   " + orjson.dumps(OK)), Action.SUCCESS, "ok"),
        (raw(200, orjson.dumps(OK)[:40]), Action.RETRY, "malformed"),
        (raw(200, {"error": {"code": 502, "message": "upstream"}}), Action.RETRY, "error_body"),
        (raw(200, {"error": {"code": "429", "message": "slow down"}}), Action.RETRY, "rate_limited"),
        (raw(200, {"error": {"message": "??"}}), Action.RETRY, "error_body"),
        (
            raw(200, {"choices": [{"finish_reason": "error", "error": {"message": "x"}, "message": {}}]}),
            Action.RETRY,
            "finish_error",
        ),
        (raw(429, {"error": {"code": 429}}, {"retry-after": "3"}), Action.RETRY, "rate_limited"),
        (raw(408, b""), Action.RETRY, "timeout"),
        (raw(500, b"oops"), Action.RETRY, "server_error"),
        (raw(502, b""), Action.RETRY, "server_error"),
        (raw(503, b""), Action.RETRY, "no_provider"),
        (raw(None, err="timeout"), Action.RETRY, "timeout"),
        (raw(None, err="connection"), Action.RETRY, "connection"),
        (
            raw(402, {"error": {"code": 402, "metadata": {"limit_source": "openrouter_in_flight_budget"}}}),
            Action.RETRY,
            "in_flight_budget",
        ),
        (
            raw(402, {"error": {"code": 402, "metadata": {"limit_source": "openrouter_credits"}}}),
            Action.STOP_CREDITS,
            "credits_exhausted",
        ),
        (raw(400, {"error": {"code": 400, "message": "bad"}}), Action.SKIP, "bad_request"),
        (raw(403, {"error": {"code": 403}}), Action.SKIP, "moderation"),
        (raw(401, {"error": {"code": 401}}), Action.FATAL, "unauthorized"),
    ],
)
def test_classification(response, action, cls):
    out = classify(response)
    assert (out.action, out.error_class) == (action, cls)


def test_retry_after_and_cost_are_read():
    out = classify(raw(429, b"", {"retry-after": "7"}))
    assert out.retry_after_s == 7.0
    assert classify(raw(200, OK)).cost_usd == pytest.approx(0.002)
    err = classify(raw(200, {"choices": [{"finish_reason": "error", "message": {}}], "usage": {"cost": 0.01}}))
    assert err.cost_usd == pytest.approx(0.01)


def test_backoff_full_jitter_bounds_and_retry_after_floor():
    import random

    pol = RetryPolicy(max_attempts=5, base_delay_s=1.0, max_delay_s=8.0)
    rng = random.Random(1)
    for attempt in range(1, 10):
        ceiling = min(8.0, 2 ** (attempt - 1))
        delays = [pol.delay(attempt, rng=rng) for _ in range(200)]
        assert min(delays) >= 0 and max(delays) <= ceiling
        assert max(delays) > ceiling * 0.8  # really spread over the whole window
    assert all(pol.delay(1, retry_after_s=5.0, rng=rng) >= 5.0 for _ in range(50))
    assert pol.should_retry(4) and not pol.should_retry(5)
    with pytest.raises(ValueError):
        RetryPolicy(max_attempts=0)


def test_aimd_halves_once_per_episode_and_recovers():
    lim = AdaptiveLimiter(maximum=1000, minimum=10, cooldown_s=1.0)

    def burst(now: float, n: int = 5) -> None:
        for _ in range(n):
            lim.on_congestion(now=now)

    burst(100.0)
    burst(100.5)
    assert lim.current == 1000  # the episode is still open
    burst(101.1)  # its first answer closes the episode: 10 of 10 were 429s
    assert lim.current == 500
    burst(101.5)  # same episode: no second halving
    assert lim.current == 500
    burst(102.2)
    assert lim.current == 250
    for i in range(100):
        burst(200.0 + i * 2)
    assert lim.current == 10  # floor
    for _ in range(20000):
        lim.on_success()
    assert lim.current == 1000  # ceiling regained, never passed
    sparse = AdaptiveLimiter(maximum=1000, cooldown_s=1.0)
    for i in range(20):  # a lone 429 now and then is no evidence of congestion
        sparse.on_congestion(now=float(i * 3))
    assert sparse.current == 1000


async def test_limiter_bounds_in_flight():
    import asyncio

    lim = AdaptiveLimiter(maximum=5, minimum=1)
    peak = 0

    async def job():
        nonlocal peak
        await lim.acquire()
        peak = max(peak, lim.in_flight)
        await asyncio.sleep(0.01)
        lim.release()

    await asyncio.gather(*(job() for _ in range(50)))
    assert peak == 5 and lim.in_flight == 0


def test_aimd_ignores_sparse_random_429s_but_halves_under_a_storm():
    lim = AdaptiveLimiter(maximum=1000, minimum=10, cooldown_s=1.0, loss_threshold=0.1)
    t = 0.0
    for i in range(2000):  # 3% random 429s: not congestion
        t += 0.001
        if i % 33 == 0:
            lim.on_congestion(now=t)
        else:
            lim.on_success(now=t)
    assert lim.current == 1000 and lim.decreases == 0
    for _ in range(5):  # a storm: most answers are 429s, one decrease per episode
        t += 1.01
        for _ in range(10):
            lim.on_congestion(now=t)
        lim.on_success(now=t)
    lim.on_success(now=t + 1.01)  # the next answer closes the last storm episode
    assert lim.decreases == 5 and lim.current < 1000 / 16
