"""``docker-compose.yml`` (no Docker engine runs here): every ``metering …`` command it runs is
one the CLI accepts, every path it builds or mounts from the repository exists, and the services,
healthchecks, volumes and start order are those of the deployment the README describes."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from metering.cli import COMMANDS, build_parser
from metering.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"


def compose() -> dict[str, Any]:
    return dict(yaml.safe_load(COMPOSE.read_text()))


def as_argv(command: str | list[str]) -> list[str]:
    return shlex.split(command) if isinstance(command, str) else [str(part) for part in command]


def metering_invocations(argv: list[str]) -> list[list[str]]:
    """The ``metering …`` commands in an argv, including those inside ``sh -c "a && b"``."""
    if argv[:2] in (["sh", "-c"], ["bash", "-c"], ["/bin/sh", "-c"]):
        found = []
        for part in re.split(r"&&|\|\||;", argv[2]):
            found.extend(metering_invocations(shlex.split(part)))
        return found
    return [argv[1:]] if argv and argv[0] == "metering" else []


def all_invocations() -> list[tuple[str, list[str]]]:
    found = []
    dockerfile_cmd = re.search(r"^CMD (\[.*\])$", DOCKERFILE.read_text(), re.MULTILINE)
    assert dockerfile_cmd, "the Dockerfile has an exec-form CMD"
    found += [("Dockerfile", a) for a in metering_invocations(yaml.safe_load(dockerfile_cmd[1]))]
    for name, service in compose()["services"].items():
        for key in ("command", "entrypoint"):
            if key in service:
                found += [(name, a) for a in metering_invocations(as_argv(service[key]))]
        test = service.get("healthcheck", {}).get("test")
        if test and test[0] in ("CMD", "CMD-SHELL"):
            argv = test[1:] if test[0] == "CMD" else ["sh", "-c", test[1]]
            found += [(name, a) for a in metering_invocations(argv)]
    return found


def test_services_start_in_order_with_healthchecks_and_volumes() -> None:
    spec = compose()
    services = spec["services"]
    assert set(services) == {"postgres", "migrate", "api", "scheduler", "grafana"}
    for name in ("postgres", "api", "scheduler", "grafana"):
        assert services[name]["healthcheck"]["test"], name
        assert services[name]["restart"] == "unless-stopped"
    assert services["migrate"]["restart"] == "no"
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    for name in ("api", "scheduler"):
        assert services[name]["depends_on"]["migrate"]["condition"] == (
            "service_completed_successfully"
        )
    for service in services.values():
        for dependency in service.get("depends_on", {}):
            assert dependency in services
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if not source.startswith((".", "/")):
                assert source in spec["volumes"], f"named volume {source} is declared"
    for name, service in services.items():
        if name in ("migrate", "api", "scheduler"):
            assert service["image"] == services["migrate"]["image"]  # the one image migrate builds
            environment = service["environment"]
            assert environment["METERING_DATABASE_URL"].startswith("postgresql+psycopg://")
            # Every METERING_ variable it sets is a setting the service reads.
            for variable in environment:
                if variable.startswith("METERING_"):
                    field = variable.removeprefix("METERING_").lower()
                    assert field in Settings.model_fields, variable
    exports = [v for v in services["scheduler"]["volumes"] if v.startswith("exports:")]
    target = exports[0].split(":")[1]
    assert services["scheduler"]["environment"]["METERING_EXPORT_DIR"] == target


def test_every_metering_command_exists_in_the_cli() -> None:
    found = all_invocations()
    used = {argv[0] for _, argv in found}
    assert {"migrate", "catalog", "serve", "scheduler"} <= used
    parser = build_parser()
    for where, argv in found:
        try:
            args = parser.parse_args(argv)
        except SystemExit:
            pytest.fail(f"{where}: `metering {' '.join(argv)}` is not a valid command")
        assert args.command in COMMANDS, (where, argv)


def test_the_cli_check_can_fail() -> None:
    """The check above rejects what the CLI does not know."""
    parser = build_parser()
    for argv in (["schedule"], ["serve", "--hots", "x"], ["export", "--date", "tomorrow"]):
        with pytest.raises(SystemExit):
            parser.parse_args(argv)


def test_every_built_and_mounted_path_exists_in_the_repository() -> None:
    spec = compose()
    built = False
    for name, service in spec["services"].items():
        build = service.get("build")
        if build is not None:
            built = True
            context = ROOT / (build if isinstance(build, str) else build.get("context", "."))
            dockerfile = context / (
                "Dockerfile" if isinstance(build, str) else build.get("dockerfile", "Dockerfile")
            )
            assert dockerfile.is_file(), name
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (ROOT / source).exists(), f"{name} mounts {source}"
    assert built
    for line in DOCKERFILE.read_text().splitlines():
        if line.startswith("COPY "):
            *sources, _destination = line.split()[1:]
            for source in sources:
                assert (ROOT / source).exists(), f"Dockerfile copies {source}"
