"""The replace hook with fake ledger and clock (tailguard.streaming.replace); real subprocess and HTTP on loopback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tailguard.core.contract.types import HealthState, NodeStatus
from tailguard.redact import Redactor
from tailguard.settings import Secret, Settings, secret_values
from tailguard.streaming.replace import (
    Attempt,
    CommandAction,
    ReplaceHook,
    Retirement,
    WebhookAction,
    action_from,
    build_hook,
    retirements,
)

pytestmark = pytest.mark.timeout(30)
NOW = 1_800_000_000.0


def status(node: str, state: HealthState = HealthState.RETIRED, since: float = NOW - 10,
           reason: str = "diagnostics_unrecoverable") -> NodeStatus:
    return NodeStatus(node_id=node, model="llm", state=state, routed=False, since_ts=since, reason=reason)


class FakeLedger:
    def __init__(self) -> None:
        self.records: dict[str, dict[str, Any]] = {}

    async def claim(self, rid: str, record: dict[str, Any], now_s: float) -> int:
        old = self.records.get(rid)
        if old is not None and old["state"] != "running":
            return 0
        if old is not None and old["lease_until"] >= now_s:
            return -1
        runs = 1 if old is None else old["runs"] + 1
        self.records[rid] = {**record, "runs": runs}
        return runs

    async def finish(self, rid: str, record: dict[str, Any]) -> None:
        self.records[rid] = record


class FakeAction:
    kind = "command"

    def __init__(self, results: list[bool]) -> None:
        self.results, self.calls = list(results), []  # type: list[bool], list[tuple[str, int]]

    async def run(self, r: Retirement, attempt: int) -> Attempt:
        self.calls.append((r.node_id, attempt))
        ok = self.results.pop(0)
        return Attempt(ok, "exit 0" if ok else "exit 1: quota exceeded")


def hook(action: FakeAction, ledger: FakeLedger | None = None, attempts: int = 3) -> tuple[ReplaceHook, list[Any],
                                                                                              list[float]]:
    published: list[dict[str, Any]] = []
    slept: list[float] = []

    async def publish(ev: dict[str, Any]) -> None:
        published.append(ev)

    async def sleep(s: float) -> None:
        slept.append(s)

    h = ReplaceHook(action, ledger or FakeLedger(), publish, attempts=attempts, timeout_s=10.0,
                    max_age_s=3600.0, clock=lambda: NOW, sleep=sleep)
    return h, published, slept


def test_only_retired_statuses_are_retirements_and_their_id_is_stable() -> None:
    rs = retirements([status("a"), status("b", HealthState.QUARANTINED), status("c", since=NOW - 5)])
    assert [r.node_id for r in rs] == ["a", "c"]
    assert rs[0].retirement_id == retirements([status("a")])[0].retirement_id
    assert rs[0].retirement_id != retirements([status("a", since=NOW - 11)])[0].retirement_id


async def test_offer_queues_each_retirement_once_and_skips_old_ones() -> None:
    h, _, _ = hook(FakeAction([True]))
    assert h.offer([status("a"), status("b", HealthState.HEALTHY), status("old", since=NOW - 7200)]) == 1
    assert h.offer([status("a")]) == 0          # queued already
    assert h.offer([status("old", since=NOW - 7200)]) == 0


async def test_success_on_a_later_attempt_publishes_one_outcome_and_records_it() -> None:
    action, ledger = FakeAction([False, False, True]), FakeLedger()
    h, published, slept = hook(action, ledger)
    (r,) = retirements([status("a")])
    ev = await h.handle(r)
    assert ev is not None and published == [ev]
    assert (ev["outcome"], ev["attempts"], ev["runs"], ev["event_id"]) == ("succeeded", 3, 1, r.retirement_id)
    assert action.calls == [("a", 1), ("a", 2), ("a", 3)] and slept == [5.0, 10.0]
    assert ledger.records[r.retirement_id]["state"] == "succeeded"
    # Settled: neither offered nor run again.
    assert h.offer([status("a")]) == 0 and await h.handle(r) is None and len(action.calls) == 3


async def test_all_attempts_failing_is_a_failed_outcome_not_an_endless_loop() -> None:
    action = FakeAction([False, False])
    h, published, _ = hook(action, attempts=2)
    (r,) = retirements([status("a")])
    ev = await h.handle(r)
    assert ev is not None and (ev["outcome"], ev["attempts"]) == ("failed", 2)
    assert ev["detail"] == "exit 1: quota exceeded" and published == [ev]
    assert await h.handle(r) is None and len(action.calls) == 2


async def test_a_restarted_worker_does_not_run_it_again_and_a_dead_ones_lease_is_taken_over() -> None:
    ledger = FakeLedger()
    (r,) = retirements([status("a")])
    first, _, _ = hook(FakeAction([True]), ledger)
    assert await first.handle(r) is not None
    again, published, _ = hook(FakeAction([]), ledger)   # a new process, same ledger
    assert await again.handle(r) is None and published == []
    # A claim whose holder died mid-action: busy until its lease ends, then run again (runs = 2).
    (r2,) = retirements([status("b")])
    ledger.records[r2.retirement_id] = {"state": "running", "lease_until": NOW + 5, "runs": 1}
    assert await again.handle(r2) is None
    ledger.records[r2.retirement_id]["lease_until"] = NOW - 1
    late, published, _ = hook(FakeAction([True]), ledger)
    ev = await late.handle(r2)
    assert ev is not None and ev["runs"] == 2


async def test_command_action_gets_the_retirement_in_its_environment(tmp_path: Path) -> None:
    out = tmp_path / "env.txt"
    a = CommandAction(f'echo "$TAILGUARD_NODE_ID $TAILGUARD_MODEL $TAILGUARD_REASON $TAILGUARD_ATTEMPT" > {out}; '
                      'echo done; exit 0', 5.0)
    (r,) = retirements([status("gpu-7; rm -rf /")])   # a hostile id stays data, never code
    res = await a.run(r, 2)
    assert res == Attempt(True, "exit 0: done")
    assert out.read_text() == "gpu-7; rm -rf / llm diagnostics_unrecoverable 2\n"
    assert (await CommandAction("echo nope >&2; exit 4", 5.0).run(r, 1)) == Attempt(False, "exit 4: nope")
    slow = await CommandAction("sleep 20", 0.3).run(r, 1)
    assert not slow.ok and "timed out after 0.3 s" in slow.detail


async def test_webhook_action_posts_json_with_an_idempotency_key() -> None:
    got: list[tuple[dict[str, Any], str | None]] = []
    status_code = [503]

    async def handler(req: web.Request) -> web.Response:
        got.append((await req.json(), req.headers.get("Idempotency-Key")))
        return web.Response(status=status_code[0], text="busy" if status_code[0] >= 300 else "ok")

    app = web.Application()
    app.router.add_post("/replace", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        a = WebhookAction(f"http://127.0.0.1:{port}/replace", 5.0)
        (r,) = retirements([status("a")])
        assert await a.run(r, 1) == Attempt(False, "HTTP 503: busy")
        status_code[0] = 202
        assert await a.run(r, 2) == Attempt(True, "HTTP 202: ok")
        body, key = got[-1]
        assert key == r.retirement_id
        assert body == {**json.loads(json.dumps(r.to_dict())), "attempt": 2}
        refused = await WebhookAction("http://127.0.0.1:1/x", 2.0).run(r, 1)
        assert not refused.ok and "Connect" in refused.detail
    finally:
        await runner.cleanup()


async def test_the_hooks_redis_client_has_the_credentials_and_tls_of_the_settings() -> None:
    async def publish(_: dict[str, Any]) -> None:
        pass

    s = Settings(redis_url="rediss://127.0.0.1:6380/0", redis_username="tg",
                 redis_password=Secret("pw"), replace_command="true")
    hook, client = build_hook(s, publish)
    try:
        assert hook is not None
        kwargs = client.connection_pool.connection_kwargs
        assert (kwargs["username"], kwargs["password"]) == ("tg", "pw")
        assert client.connection_pool.connection_class.__name__ == "SSLConnection"
    finally:
        await client.aclose()


async def test_the_command_gets_an_explicit_environment_not_the_workers(tmp_path: Path) -> None:
    worker_env = {"PATH": "/usr/bin:/bin", "HOME": "/home/tg", "KUBECONFIG": "/etc/kube/config",
                  "TAILGUARD_KAFKA_SASL_PASSWORD": "kafka-s3cret", "AWS_SECRET_ACCESS_KEY": "aws-s3cret",
                  "TAILGUARD_REDIS_PASSWORD_FILE": "/run/secrets/redis",
                  "TAILGUARD_REPLACE_TIMEOUT_S": "7", "TAILGUARD_REPLACE_ENV": "KUBECONFIG"}
    s = Settings(replace_command="env", replace_env="KUBECONFIG")
    action = action_from(s, worker_env)
    assert isinstance(action, CommandAction)
    (r,) = retirements([status("a")])
    res = await action.run(r, 1)
    got = dict(line.split("=", 1) for line in res.detail.removeprefix("exit 0: ").splitlines())
    assert res.ok
    assert {k: got[k] for k in ("PATH", "KUBECONFIG", "TAILGUARD_REPLACE_TIMEOUT_S",
                                "TAILGUARD_REPLACE_ENV", "TAILGUARD_NODE_ID")} == {
        "PATH": "/usr/bin:/bin", "KUBECONFIG": "/etc/kube/config", "TAILGUARD_REPLACE_TIMEOUT_S": "7",
        "TAILGUARD_REPLACE_ENV": "KUBECONFIG", "TAILGUARD_NODE_ID": "a"}
    # Nothing else of the worker's: no password, no HOME (the shell may add PWD, SHLVL, _).
    assert set(got) - {"PWD", "SHLVL", "_", "OLDPWD"} == {
        "PATH", "KUBECONFIG", "TAILGUARD_REPLACE_TIMEOUT_S", "TAILGUARD_REPLACE_ENV",
        *r.env(1)}, got
    assert "s3cret" not in res.detail


async def test_the_actions_output_is_redacted_before_it_is_logged_published_or_recorded(
        caplog: pytest.LogCaptureFixture) -> None:
    s = Settings(redis_password=Secret("r3dis-pw-xyz"),
                 replace_command=(
                     "printf 'pushing \\033[31mERROR\\033[0m to https://deploy:gh-pass-42@git.example/x\\n"
                     "Authorization: Bearer eyJhbGciOiJI.eyJzdWIiOiIx.c2lnbmF0dXJl\\n"
                     "api_key=AKIAABCDEFGHIJKLMNOP password: hunter2 redis r3dis-pw-xyz done\\n'; exit 1"))
    action = action_from(s, {"PATH": "/usr/bin:/bin"})
    assert action is not None
    published: list[dict[str, Any]] = []

    async def publish(ev: dict[str, Any]) -> None:
        published.append(ev)

    async def sleep(_: float) -> None:
        pass

    ledger = FakeLedger()
    h = ReplaceHook(action, ledger, publish, attempts=2, timeout_s=10.0, max_age_s=3600.0,
                    clock=lambda: NOW, sleep=sleep, redact=Redactor(secret_values(s)))
    (r,) = retirements([status("a")])
    with caplog.at_level("INFO", logger="tailguard.streaming.replace"):
        ev = await h.handle(r)
    assert ev is not None and ev["outcome"] == "failed"
    seen = [published[0]["detail"], json.dumps(ledger.records), caplog.text]
    for text in seen:
        for leak in ("gh-pass-42", "eyJhbGciOiJI", "AKIAABCDEFGHIJKLMNOP", "hunter2", "r3dis-pw-xyz",
                     "\x1b", "\\x1b"):
            assert leak not in text, (leak, text)
    detail = published[0]["detail"]
    assert detail.startswith("exit 1: pushing ERROR to https://deploy:***@git.example/x | ")
    assert detail.endswith("redis *** done"), detail


async def test_a_webhook_failure_names_no_part_of_its_secret_url(caplog: pytest.LogCaptureFixture) -> None:
    url = "http://hook-user:hook-pw-77@127.0.0.1:1/services/T0AAAA/B0BBBB/tok3n9f8e7d6c5b4a3?sig=q5ig"
    s = Settings(replace_webhook_url=Secret(url))
    action = action_from(s)
    assert isinstance(action, WebhookAction)
    published: list[dict[str, Any]] = []

    async def publish(ev: dict[str, Any]) -> None:
        published.append(ev)

    async def sleep(_: float) -> None:
        pass

    h = ReplaceHook(action, FakeLedger(), publish, attempts=1, timeout_s=2.0, max_age_s=3600.0,
                    clock=lambda: NOW, sleep=sleep, redact=Redactor(secret_values(s)))
    (r,) = retirements([status("a")])
    with caplog.at_level("INFO", logger="tailguard.streaming.replace"):
        await h.handle(r)
    for leak in ("hook-pw-77", "tok3n9f8e7d6c5b4a3", "q5ig"):
        assert leak not in published[0]["detail"] and leak not in caplog.text
