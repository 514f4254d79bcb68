"""The fleet stack's files: Prometheus config and rules through promtool, the
collector config and docker-compose.yml checked structurally."""

from __future__ import annotations

import re
import subprocess

import yaml

from tests.conftest import ROOT, binary

PROMETHEUS = ROOT / "deploy" / "prometheus"


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [binary("promtool"), *args], capture_output=True, text=True, cwd=PROMETHEUS, timeout=60
    )


def test_promtool_check_config() -> None:
    out = promtool("check", "config", "prometheus.yml")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS: 2 rule files found" in out.stdout


def test_promtool_check_rules() -> None:
    out = promtool("check", "rules", "rules/alerts.yml", "rules/recording.yml")
    assert out.returncode == 0, out.stdout + out.stderr


def test_promtool_test_rules_covers_every_alert() -> None:
    out = promtool("test", "rules", "tests/alerts_test.yml")
    assert out.returncode == 0, out.stdout + out.stderr
    alerts = {
        rule["alert"]
        for group in yaml.safe_load((PROMETHEUS / "rules" / "alerts.yml").read_text())["groups"]
        for rule in group["rules"]
    }
    tested = {
        case["alertname"]
        for test in yaml.safe_load((PROMETHEUS / "tests" / "alerts_test.yml").read_text())["tests"]
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    assert (
        alerts
        == tested
        == {
            "EdgewattDeviceSilent",
            "EdgewattTargetDied",
            "EdgewattDevicePowerHigh",
            "EdgewattEnergyUnattributed",
            "EdgewattSamplingBehind",
        }
    )


def test_rules_use_metrics_the_daemon_exports() -> None:
    from edgewatt.core.metrics import TABLE

    names = {m.prometheus_name for m in TABLE}
    text = "\n".join(
        rule["expr"]
        for name in ("alerts.yml", "recording.yml")
        for group in yaml.safe_load((PROMETHEUS / "rules" / name).read_text())["groups"]
        for rule in group["rules"]
    )
    selectors = re.sub(r"\{[^}]*\}", "", text)  # label matchers name labels, not metrics
    used = set(re.findall(r"\b(?:hw|edgewatt|process|system)_[a-z_]+", selectors))
    assert used <= names, used - names


def test_collector_pipelines_reference_defined_components() -> None:
    config = yaml.safe_load((ROOT / "deploy" / "otel-collector" / "config.yaml").read_text())
    for pipeline in config["service"]["pipelines"].values():
        for kind in ("receivers", "processors", "exporters"):
            for name in pipeline.get(kind, []):
                assert name in config[kind], f"{kind} {name} is not defined"
    for ext in config["service"].get("extensions", []):
        assert ext in config["extensions"]
    protocols = config["receivers"]["otlp"]["protocols"]
    assert protocols["grpc"]["endpoint"] == "0.0.0.0:4317"
    assert protocols["http"]["endpoint"] == "0.0.0.0:4318"
    assert config["exporters"]["prometheus"]["resource_to_telemetry_conversion"]["enabled"]


def test_compose_images_pinned_paths_exist_healthchecks() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert set(services) == {"edgewatt", "otel-collector", "prometheus", "grafana"}
    for name, service in services.items():
        image = service.get("image", "")
        assert re.search(r":v?\d+\.\d+\.\d+$", image), f"{name}: image {image!r} not pinned"
        assert "healthcheck" in service, f"{name} has no healthcheck"
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), f"{name}: {source} is not in the repo"
            elif not source.startswith("/"):
                assert source in compose["volumes"], f"{name}: volume {source} not declared"
    daemon = services["edgewatt"]
    assert daemon["pid"] == "host" and daemon["build"] == "."
    assert all(v.endswith(":ro") for v in daemon["volumes"] if v.startswith(("/proc", "/sys")))
    assert "otel-collector:4318" in " ".join(daemon["command"])
    collector_image = services["otel-collector"]["image"].split(":")[1]
    collector_config = (ROOT / "deploy" / "otel-collector" / "config.yaml").read_text()
    assert collector_image in collector_config  # the config names the version it is for


def test_grafana_provisioning_is_valid() -> None:
    prov = ROOT / "deploy" / "grafana" / "provisioning"
    datasource = yaml.safe_load((prov / "datasources" / "prometheus.yml").read_text())
    assert datasource["datasources"][0]["uid"] == "edgewatt-prometheus"
    provider = yaml.safe_load((prov / "dashboards" / "edgewatt.yml").read_text())
    assert provider["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"
