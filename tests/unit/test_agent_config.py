"""The agent's configuration and its import isolation (tailguard.agent needs no worker dependency)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tailguard.agent.config import AgentConfigError, NodeSpec, default_group, load_config

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("faust", "mode", "redis", "numpy", "fastdigest", "aiohttp", "prometheus_client")


def _modules(code: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys, json; print(json.dumps(sorted(sys.modules)))"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60, check=True)
    return list(json.loads(out.stdout.splitlines()[-1]))


def test_agent_package_imports_nothing_of_the_worker() -> None:
    mods = _modules("import tailguard.agent.cli, tailguard.agent.runner, tailguard.agent.checks, tailguard.agent.gemm")
    bad = [m for m in mods if m.split(".")[0] in HEAVY
           or m.startswith(("tailguard.core", "tailguard.streaming", "tailguard.settings", "tailguard.routing"))]
    assert bad == [], bad
    assert "tailguard.agent.verdict" in mods  # the import ran at all
    assert "aiokafka" not in mods       # imported only when the Kafka loop starts (--once needs none)


def test_tailguard_diagnose_entry_point_stays_light() -> None:
    # `tailguard diagnose` goes through tailguard.cli, which imports only the stdlib-only
    # tailguard.core.contract.config.
    mods = _modules("import tailguard.cli, importlib; importlib.import_module(tailguard.cli.COMMANDS['diagnose'][0])")
    assert [m for m in mods if m.split(".")[0] in HEAVY] == []
    assert [m for m in mods if m.startswith("tailguard.core.")] == ["tailguard.core.contract",
                                                                    "tailguard.core.contract.config"]


def test_file_flags_and_environment(tmp_path: Path) -> None:
    f = tmp_path / "agent.toml"
    f.write_text("""
expected_gpus = 8
expected_processes = ["vllm"]
[nodes]
"gpu-node-07" = [0, 1]
"gpu-node-08" = [2, 3]
[timeouts_s]
dcgmi = 300
[gemm]
min_ratio = 0.8
[[check]]
name = "nvlink"
command = "nvidia-smi nvlink -s | grep -q inactive && exit 1 || exit 0"
on_fail = "not_recoverable"
""")
    cfg = load_config(str(f), [], {"TAILGUARD_KAFKA_BOOTSTRAP": "k1:9092",
                                   "TAILGUARD_TOPIC_DIAGNOSTICS_RESULTS": "res"}, group_id=None)
    assert cfg.nodes == (NodeSpec("gpu-node-07", (0, 1)), NodeSpec("gpu-node-08", (2, 3)))
    assert (cfg.kafka_bootstrap, cfg.results_topic, cfg.requests_topic) == ("k1:9092", "res",
                                                                             "node-diagnostics-requests")
    assert cfg.timeout("dcgmi") == 300.0 and cfg.timeout("nvidia_smi") == 20.0
    assert cfg.gemm_min_ratio == 0.8 and cfg.expected_gpus == 8
    (c,) = cfg.user_checks
    assert c.command[:2] == ("/bin/sh", "-c") and c.on_fail == "not_recoverable"
    assert cfg.group == "tailguard-agent-gpu-node-07_gpu-node-08"
    # Flags win over the file and the environment.
    cfg2 = load_config(str(f), ["solo=3"], {"TAILGUARD_KAFKA_BOOTSTRAP": "k1:9092"},
                       kafka_bootstrap="k2:9093", group_id="g")
    assert (cfg2.nodes, cfg2.kafka_bootstrap, cfg2.group) == ((NodeSpec("solo", (3,)),), "k2:9093", "g")


@pytest.mark.parametrize(("text", "nodes", "env", "name"), [
    ("", [], {}, "--node"),
    ("", ["n"], {"TAILGUARD_KAFKA_BOOTSTRAP": "nohost"}, "TAILGUARD_KAFKA_BOOTSTRAP"),
    ("typo_key = 1", ["n"], {}, "typo_key"),
    ("[gemm]\nmin_ratio = 1.5", ["n"], {}, "gemm.min_ratio"),
    ("[timeouts_s]\nxid = 0", ["n"], {}, "timeouts_s.xid"),
    ("[timeouts_s]\nnvidia = 5", ["n"], {}, "timeouts_s.nvidia"),
    ('[[check]]\nname = "x"\ncommand = "true"\non_fail = "retire"', ["n"], {}, "check.x.on_fail"),
    ('expected_processes = ["(unclosed"]', ["n"], {}, "expected_processes"),
    ("nodes = [", ["n"], {}, "--config"),
    ("", ["n=a,b"], {}, "--node"),
    ('state_dir = "/x"\n[timeouts_s]\nxid = "soon"', ["n"], {}, "timeouts_s.xid"),
    ("[gemm]\nsize = [1]", ["n"], {}, "gemm.size"),
])
def test_bad_settings_name_the_culprit(tmp_path: Path, text: str, nodes: list[str], env: dict[str, str],
                                       name: str) -> None:
    f = tmp_path / "a.toml"
    f.write_text(text)
    with pytest.raises(AgentConfigError) as e:
        load_config(str(f), nodes, env)
    assert e.value.name == name, str(e.value)


def test_default_group_is_a_safe_kafka_name() -> None:
    assert default_group((NodeSpec("a b/c"),)) == "tailguard-agent-a_b_c"


def test_the_agent_takes_the_workers_kafka_security_variables(tmp_path: Path) -> None:
    pw = tmp_path / "pw"
    pw.write_text("s3cret-pw\n")
    env = {"TAILGUARD_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "TAILGUARD_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
           "TAILGUARD_KAFKA_SASL_USERNAME": "agent", "TAILGUARD_KAFKA_SASL_PASSWORD_FILE": str(pw),
           "TAILGUARD_KAFKA_SSL_CHECK_HOSTNAME": "false"}
    cfg = load_config(None, ["n1"], environ=env)
    sec = cfg.security
    assert (sec.protocol, sec.sasl_mechanism, sec.sasl_username, sec.sasl_password, sec.ssl_check_hostname) == (
        "SASL_SSL", "SCRAM-SHA-512", "agent", "s3cret-pw", False)
    assert "s3cret" not in repr(cfg)
    # the same rules as the worker's, the same variable names in the errors
    with pytest.raises(AgentConfigError) as info:
        load_config(None, ["n1"], environ={**env, "TAILGUARD_KAFKA_SASL_PASSWORD_FILE": str(tmp_path / "none")})
    assert info.value.name == "TAILGUARD_KAFKA_SASL_PASSWORD_FILE"
    with pytest.raises(AgentConfigError) as info:
        load_config(None, ["n1"], environ={"TAILGUARD_KAFKA_SECURITY_PROTOCOL": "SASL_SSL"})
    assert info.value.name == "TAILGUARD_KAFKA_SASL_USERNAME"
    with pytest.raises(AgentConfigError) as info:
        load_config(None, ["n1"], environ={"TAILGUARD_KAFKA_SSL_CAFILE": "/etc/ca.pem"})
    assert info.value.name == "TAILGUARD_KAFKA_SSL_CAFILE" and "uses no TLS" in info.value.allowed
