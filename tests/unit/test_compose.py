"""docker-compose.yml and the Dockerfile agree with the code.

No Docker engine runs here. scripts/test validates the files with compose-go, the
Compose Specification's loader (scripts/compose-check: schema, merge of
docker-compose.secure.yml, interpolation); here they are checked by structure: the
services and their images, host ports bound to 127.0.0.1 only, every
``TAILGUARD_*`` variable a container gets is one the code knows (a typo there
would stop the worker at start), and the image installs the package and runs
``tailguard worker``.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from tailguard import cli
from tailguard.settings import env_names, load, secret_file_names
from tailguard.sim import scenario

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load((ROOT / "docker-compose.yml").read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    svc = compose["services"]
    assert isinstance(svc, dict)
    return svc


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    text = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    text = re.sub(r"\\\n", " ", "\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith("#")))
    out = []
    for line in text.splitlines():
        if line.strip():
            op, _, args = line.strip().partition(" ")
            out.append((op.upper(), args.strip()))
    return out


def exec_form(args: str) -> list[str]:
    """An ENTRYPOINT/CMD argument: JSON exec form, or shell form split like a shell."""
    if args.startswith("["):
        value = json.loads(args)
        assert isinstance(value, list)
        return [str(v) for v in value]
    return shlex.split(args)


def image_command(service: dict[str, Any]) -> list[str]:
    """What a container of ``service`` runs: the image's ENTRYPOINT + (command or CMD)."""
    instr = dockerfile_instructions()
    entry = [exec_form(a) for op, a in instr if op == "ENTRYPOINT"]
    cmd = [exec_form(a) for op, a in instr if op == "CMD"]
    command = service.get("command")
    if isinstance(command, str):
        command = shlex.split(command)
    entrypoint = service.get("entrypoint", entry[-1] if entry else [])
    return list(entrypoint) + list(command if command is not None else (cmd[-1] if cmd else []))


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {str(k): str(v) for k, v in env.items()}


def test_services_and_images(services: dict[str, dict[str, Any]]) -> None:
    assert {"kafka", "redis", "worker", "simulator"} <= set(services)
    assert re.fullmatch(r"apache/kafka:4\.\d+\.\d+", services["kafka"]["image"])
    assert re.fullmatch(r"redis:7(\.\d+)*", services["redis"]["image"])
    assert services["worker"]["build"] in (".", {"context": "."})
    assert services["simulator"]["profiles"] == ["sim"]
    assert "profiles" not in services["worker"]


def test_kafka_is_a_single_kraft_node(services: dict[str, dict[str, Any]]) -> None:
    env = environment(services["kafka"])
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"].startswith(env["KAFKA_NODE_ID"] + "@")
    listeners = dict(item.split("://", 1) for item in env["KAFKA_LISTENERS"].split(","))
    advertised = dict(item.split("://", 1) for item in env["KAFKA_ADVERTISED_LISTENERS"].split(","))
    assert env["KAFKA_CONTROLLER_LISTENER_NAMES"] in listeners
    protocol_map = dict(item.split(":") for item in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    assert set(listeners) <= set(protocol_map)
    # The address the worker is given is an advertised listener of the broker.
    assert environment(services["worker"])["TAILGUARD_KAFKA_BOOTSTRAP"] in advertised.values()
    assert env["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"] == "1"


def test_host_ports_are_bound_to_loopback_only(services: dict[str, dict[str, Any]]) -> None:
    seen = 0
    for name, svc in services.items():
        for port in svc.get("ports", []):
            if isinstance(port, dict):
                assert port.get("host_ip") == "127.0.0.1", (name, port)
            else:
                assert str(port).startswith("127.0.0.1:"), (name, port)
            seen += 1
    assert seen >= 2  # at least Kafka and Redis are reachable from the host


def test_kafka_host_port_matches_its_advertised_host_listener(services: dict[str, dict[str, Any]]) -> None:
    env = environment(services["kafka"])
    advertised = [a.split("://", 1)[1] for a in env["KAFKA_ADVERTISED_LISTENERS"].split(",")]
    published = {":".join(str(p).split(":")[:2]) for p in services["kafka"]["ports"]}
    assert published & set(advertised), "a client on the host must be sent back to the published port"


def test_every_tailguard_variable_is_a_known_setting(services: dict[str, dict[str, Any]]) -> None:
    known = set(env_names())
    for name in ("worker", "simulator"):
        env = environment(services[name])
        tailguard_vars = {k for k in env if k.startswith("TAILGUARD_")}
        assert tailguard_vars, name
        assert tailguard_vars <= known, (name, tailguard_vars - known)
        load(env)  # and every value is valid: the container would not start otherwise
    dockerfile_env = " ".join(a for op, a in dockerfile_instructions() if op == "ENV")
    assert set(re.findall(r"TAILGUARD_[A-Z0-9_]+", dockerfile_env)) <= known


def test_worker_talks_to_the_compose_kafka_and_redis(services: dict[str, dict[str, Any]]) -> None:
    env = environment(services["worker"])
    assert env["TAILGUARD_KAFKA_BOOTSTRAP"] == "kafka:9092"
    assert env["TAILGUARD_REDIS_URL"] == "redis://redis:6379/0"
    deps = services["worker"]["depends_on"]
    assert deps["kafka"]["condition"] == "service_healthy"
    assert deps["redis"]["condition"] == "service_healthy"
    assert "healthcheck" in services["kafka"] and "healthcheck" in services["redis"]


def test_worker_runs_tailguard_worker(services: dict[str, dict[str, Any]]) -> None:
    assert image_command(services["worker"]) == ["tailguard", "worker"]


def test_every_tailguard_service_runs_a_known_command(services: dict[str, dict[str, Any]]) -> None:
    ours = {n: s for n, s in services.items() if "build" in s}
    assert {"worker", "simulator", "proxy", "load"} <= set(ours)
    for name, svc in ours.items():
        command = image_command(svc)
        assert command[0] == "tailguard" and command[1] in cli.COMMANDS, (name, command)
        assert svc.get("image") == services["worker"]["image"], name  # one image, built once
    assert image_command(services["simulator"])[:3] == ["tailguard", "simulate", "fleet"]
    assert image_command(services["load"])[:3] == ["tailguard", "simulate", "load"]


def test_sim_profile_wiring(services: dict[str, dict[str, Any]]) -> None:
    """The simulated fleet, the proxy in front of it and the load generator find each other."""
    for name in ("simulator", "proxy", "load"):
        assert services[name]["profiles"] == ["sim"], name
    sim = image_command(services["simulator"])
    assert sim[sim.index("--host") + 1] == "0.0.0.0"  # reachable from the proxy's container
    base_port = int(sim[sim.index("--base-port") + 1])
    proxy = image_command(services["proxy"])
    assert proxy[proxy.index("--listen") + 1].startswith("0.0.0.0:")
    backends = dict(b.split("=", 1) for b in proxy[proxy.index("--backends") + 1].split(","))
    assert sorted(backends.values()) == [f"http://simulator:{base_port + i}" for i in range(len(backends))]
    load = image_command(services["load"])
    assert load[load.index("--target") + 1] == "http://proxy:" + proxy[proxy.index("--listen") + 1].split(":")[1]
    # The scenario the simulator runs exists in the image (COPY . .), its nodes are the proxy's
    # backends, and the load generator asks for one of its models.
    sc = scenario.load(ROOT / sim[3])
    assert sorted(backends) == sorted(n.node_id for n in sc.nodes)
    assert load[load.index("--model") + 1] in {m.name for m in sc.models}


def test_dockerfile_installs_the_package_and_runs_the_worker_by_default() -> None:
    instr = dockerfile_instructions()
    assert instr[0][0] == "FROM" and re.match(r"python:3\.1[1-9]", instr[0][1])
    runs = " ".join(a for op, a in instr if op == "RUN")
    assert re.search(r"pip install (--no-deps )?\.(\s|$)", runs)
    copied = " ".join(a for op, a in instr if op == "COPY")
    assert "pyproject.toml" in copied or copied.startswith(". ")
    assert image_command({}) == ["tailguard", "worker"]


def test_dockerignore_keeps_local_state_out_of_the_image() -> None:
    ignored = set((ROOT / ".dockerignore").read_text(encoding="utf-8").split())
    assert {".git", ".venv"} <= ignored


# --- docker-compose.secure.yml: the worker against a secured Kafka and Redis ---------------


class _ComposeLoader(yaml.SafeLoader):
    """SafeLoader that knows Compose's ``!reset`` tag (an override that clears a value)."""


_ComposeLoader.add_constructor("!reset", lambda loader, node: None)


def test_secure_override_gives_the_worker_valid_security_settings(
    services: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    secure = yaml.load((ROOT / "docker-compose.secure.yml").read_text(encoding="utf-8"), Loader=_ComposeLoader)
    worker = secure["services"]["worker"]
    env = environment(services["worker"]) | environment(worker)
    env = {k: re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", v) for k, v in env.items()}   # the defaults
    known = set(env_names()) | set(secret_file_names())
    assert {k for k in env if k.startswith("TAILGUARD_")} <= known
    # Every secret comes from a file Compose mounts under /run/secrets, itself from ./secrets/.
    mounted = {f"/run/secrets/{name}": secure["secrets"][name]["file"] for name in worker["secrets"]}
    files = {k: v for k, v in env.items() if k.endswith("_FILE") or k.endswith("_CAFILE")}
    assert files and set(files.values()) <= set(mounted)
    assert all(f.startswith("./secrets/") for f in mounted.values())
    assert not any("PASSWORD" in k and not k.endswith("_FILE") for k in env), "a secret in the environment"
    for k, v in files.items():          # the container's files, stood in for here
        (tmp_path / Path(v).name).write_text("-----BEGIN CERTIFICATE-----\n" if "CAFILE" in k else "pw\n")
        env[k] = str(tmp_path / Path(v).name)
    s = load(env)
    assert (s.kafka_security_protocol, s.kafka_sasl_mechanism) == ("SASL_SSL", "SCRAM-SHA-512")
    assert s.redis_url.startswith("rediss://") and s.redis_password.reveal() == "pw"
    assert worker["depends_on"] is None      # no local kafka/redis service to wait for
    gitignore = (ROOT / ".gitignore").read_text(encoding="utf-8").split()
    assert "secrets/" in gitignore and "secrets" in (ROOT / ".dockerignore").read_text(encoding="utf-8").split()
