"""``tailguard k8s-sync``: the command that runs the controller (and, with ``--webhook``, the
admission webhook) against the apiserver and the routing set in Redis.

Owns start-up: which namespace, which credentials (``TAILGUARD_K8S_*``, in a pod the mounted
service account), the RBAC check, and wiring :class:`~tailguard.k8s.sync.PodCache`,
:class:`~tailguard.k8s.sync.K8sSync`, :class:`~tailguard.k8s.lease.LeaderElector`, the routing reader and
the metrics endpoint together until SIGTERM.

Guarantees:

* **RBAC checked first.** Before anything else it asks the apiserver (SelfSubjectAccessReview)
  for each permission it needs; when one is missing it exits 2 with ONE line naming every
  missing verb and resource, in the namespace it would use.
* **Settings errors stop the start** in one line naming the setting; an unreachable Redis does
  not (the controller waits, changing nothing).
* On SIGTERM the Lease is released, so the other replica takes over at once.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import socket
import sys
import uuid
from pathlib import Path

from tailguard.k8s import K8sError
from tailguard.k8s.api import AiohttpTransport, Client, Permission
from tailguard.k8s.lease import LeaderElector
from tailguard.k8s.metrics import SyncMetrics
from tailguard.k8s.plan import NodeIdRule
from tailguard.k8s.sync import AlwaysLeader, K8sSync, Leadership, PodCache
from tailguard.lb.source import add_routing_args, run_main, settings_from_args, stop_on_signals
from tailguard.settings import Settings, redact_url

log = logging.getLogger(__name__)

SA_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

PODS = (Permission("get", "pods"), Permission("list", "pods"), Permission("watch", "pods"),
        Permission("patch", "pods/status"))
LEASES = (Permission("get", "leases", "coordination.k8s.io"), Permission("create", "leases", "coordination.k8s.io"),
          Permission("update", "leases", "coordination.k8s.io"))


def namespace_of(settings: Settings, sa_file: str = SA_NAMESPACE_FILE) -> str:
    """TAILGUARD_K8S_NAMESPACE, else the service account's namespace, else ``default``."""
    if settings.k8s_namespace:
        return settings.k8s_namespace
    try:
        return Path(sa_file).read_text(encoding="utf-8").strip() or "default"
    except OSError:
        return "default"


async def missing_permissions(client: Client, namespace: str, leases: bool) -> list[Permission]:
    wanted = PODS + (LEASES if leases else ())
    return [p for p in wanted if not await client.allowed(namespace, p)]


def missing_line(namespace: str, missing: list[Permission]) -> str:
    return (f"missing RBAC permission(s) in namespace {namespace!r}: {', '.join(map(str, missing))}; grant them "
            "to tailguard's service account (a Role + RoleBinding, as deploy/helm/tailguard's; docs/kubernetes.md)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tailguard k8s-sync",
        description="Keep a pod readiness-gate condition in step with tailguard's routing sets "
                    "(pods of held-out nodes leave every Service's EndpointSlices).")
    p.add_argument("--webhook", action="store_true",
                   help="also serve the mutating admission webhook that adds the gate to new pods "
                        "(TAILGUARD_K8S_WEBHOOK_LISTEN, _CERTFILE, _KEYFILE)")
    p.add_argument("--no-leader-election", action="store_true",
                   help="act without a Lease (one replica only; two would fight)")
    p.add_argument("--identity", default=None,
                   help="this replica's name in the Lease (default: the host name + a random suffix)")
    add_routing_args(p)
    return p


async def _run(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    prog = "tailguard k8s-sync"
    if not settings.k8s_api_url:
        print(f"{prog}: TAILGUARD_K8S_API_URL is empty and this is not a pod (no KUBERNETES_SERVICE_HOST): "
              "set it to the apiserver's https:// URL", file=sys.stderr)
        return 2
    namespace = namespace_of(settings)
    rule = NodeIdRule.parse(settings.k8s_node_id)
    transport = AiohttpTransport(settings.k8s_api_url, token_file=settings.k8s_token_file,
                                 ca_file=settings.k8s_ca_file)
    try:
        return await _serve(args, settings, namespace, rule, Client(transport))
    finally:
        await transport.aclose()


async def _serve(args: argparse.Namespace, settings: Settings, namespace: str, rule: NodeIdRule,
                 client: Client) -> int:
    from tailguard.routing.client import check_redis, connect_for, keys_for
    from tailguard.routing.reader import RoutingTable

    prog = "tailguard k8s-sync"
    try:
        missing = await missing_permissions(client, namespace, not args.no_leader_election)
    except K8sError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 1
    if missing:
        print(f"{prog}: {missing_line(namespace, missing)}", file=sys.stderr)
        return 2
    await check_redis(settings)       # a refused login or certificate stops the start, in one line
    metrics = SyncMetrics()
    stop = stop_on_signals()
    wake = asyncio.Event()
    identity = args.identity or f"{socket.gethostname()}-{uuid.uuid4().hex[:6]}"

    def leadership_changed(leader: bool) -> None:
        metrics.leader.set(1 if leader else 0)
        wake.set()

    elector = None if args.no_leader_election else LeaderElector(
        client, namespace, settings.k8s_lease_name, identity, duration_s=settings.k8s_lease_duration_s,
        on_change=leadership_changed)
    leadership: Leadership = elector if elector is not None else AlwaysLeader()
    pods = PodCache(client, namespace, settings.k8s_condition, rule, settings.k8s_model_label,
                    on_change=wake.set, metrics=metrics)
    redis = connect_for(settings)
    runner = None
    try:
        async with RoutingTable(redis, keys_for(settings), poll_interval_s=args.poll_interval_s,
                                on_change=lambda _e: wake.set()) as table:
            sync = K8sSync(client, pods, table, settings.k8s_condition,
                           max_ejected_fraction=settings.detector.max_ejected_fraction, leadership=leadership,
                           metrics=metrics, resync_s=settings.k8s_resync_s, wake=wake)
            if args.webhook:
                from tailguard.k8s.webhook import start_webhook
                runner = await start_webhook(settings.k8s_webhook_listen, settings.k8s_webhook_certfile,
                                             settings.k8s_webhook_keyfile, settings.k8s_condition, metrics)
            metrics.serve(settings.metrics_port, settings.metrics_host)
            print(f"{prog}: pods of namespace {namespace!r} at {settings.k8s_api_url}: condition "
                  f"{settings.k8s_condition} (node id: {settings.k8s_node_id}, model label "
                  f"{settings.k8s_model_label}); routing from {redact_url(settings.redis_url)} prefix "
                  f"{settings.key_prefix!r}; " + (f"Lease {settings.k8s_lease_name} as {identity}" if elector
                                                  else "no leader election")
                  + (f"; webhook on https://{settings.k8s_webhook_listen}/mutate" if runner else ""),
                  file=sys.stderr, flush=True)
            tasks = [asyncio.create_task(pods.run(stop), name="k8s-pods"),
                     asyncio.create_task(sync.run(stop), name="k8s-sync")]
            if elector is not None:
                tasks.append(asyncio.create_task(elector.run(stop), name="k8s-lease"))
            await stop.wait()
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if elector is not None:
                await elector.release()
    finally:
        if runner is not None:
            await runner.cleanup()
        metrics.close()
        await redis.aclose()
    return 0


def main(argv: list[str]) -> int:
    return run_main("tailguard k8s-sync", build_parser(), _run, argv)
