"""``docker-compose.yml`` (no Docker engine runs here): every ``metering …`` command it runs is one
the CLI accepts, every path it builds or mounts from the repository exists, and the services,
healthchecks, volumes and start order are those of the deployment docs/operations.md#docker-compose
describes; every image is pinned; the ``citus`` profile is a coordinator and two workers on the
official Citus 13.2 / PostgreSQL 15 image, the workers registered, the service pointed at the
coordinator."""

from __future__ import annotations

import copy
import re
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from metering.cli import COMMANDS, build_parser
from metering.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"

DEFAULT_SERVICES = {"postgres", "migrate", "api", "scheduler", "grafana"}
METERING_IMAGE = "metering:local"  # the one image the metering services build
# citusdata/docker publishes each release for PostgreSQL 15 as `<major>.<minor>.<patch>-pg15`.
CITUS_IMAGE = re.compile(r"citusdata/citus:13\.2\.\d+-pg15")


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


def default_services(spec: dict[str, Any]) -> dict[str, Any]:
    return {n: s for n, s in spec["services"].items() if not s.get("profiles")}


def citus_services(spec: dict[str, Any]) -> dict[str, Any]:
    return {n: s for n, s in spec["services"].items() if "citus" in s.get("profiles", [])}


def test_services_start_in_order_with_healthchecks_and_volumes() -> None:
    spec = compose()
    services = default_services(spec)
    assert set(services) == DEFAULT_SERVICES
    for name in ("postgres", "api", "scheduler", "grafana"):
        assert services[name]["healthcheck"]["test"], name
        assert services[name]["restart"] == "unless-stopped"
    assert services["migrate"]["restart"] == "no"
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    for name in ("api", "scheduler"):
        assert services[name]["depends_on"]["migrate"]["condition"] == (
            "service_completed_successfully"
        )
    for service in spec["services"].values():
        for dependency in service.get("depends_on", {}):
            assert dependency in spec["services"]
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if not source.startswith((".", "/")):
                assert source in spec["volumes"], f"named volume {source} is declared"
    assert services["migrate"]["image"] == METERING_IMAGE
    for name, service in spec["services"].items():
        if metering_invocations(as_argv(service.get("command", []))):
            assert service["image"] == METERING_IMAGE, name
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


def unpinned_images(spec: dict[str, Any]) -> list[str]:
    """Images that are not pinned to a version: no tag, ``latest``, or a tag without a number
    (``alpine``, ``nightly``). The metering image is built here, so it is exempt where it is."""
    found = []
    for name, service in spec["services"].items():
        image = service.get("image")
        if image is None:
            found.append(f"{name}: no image")
            continue
        if (image == METERING_IMAGE and "build" in service) or "@sha256:" in image:
            continue
        _, _, tag = image.rpartition("/")[2].partition(":")
        if not tag or tag.startswith("latest") or not re.search(r"\d", tag):
            found.append(f"{name}: {image} is not pinned")
    return found


def cluster_target(url: str) -> tuple[str, list[str], str] | None:
    """(user, hosts, database) of a URL naming several nodes of a cluster
    (``postgresql+psycopg://user:password@/db?host=h1:5432&host=h2:5432…&load_balance_hosts=random``,
    docs/citus.md#connections-to-every-node), the password maybe a ``${…}`` substitution; None
    for any other URL."""
    found = re.fullmatch(
        r"postgresql\+psycopg://([^:@/]+)(?::.*)?@/(\w+)\?((?:host=[\w-]+:5432&)+)"
        r"load_balance_hosts=random",
        url,
    )
    if found is None:
        return None
    return found[1], re.findall(r"host=([\w-]+):5432&", found[3]), found[2]


def citus_problems(spec: dict[str, Any]) -> list[str]:
    """What keeps the ``citus`` profile from being the cluster docs/citus.md#on-docker-compose
    describes, or keeps the default profile from being untouched by it."""
    problems = []
    services = spec["services"]
    citus = citus_services(spec)
    for name, service in services.items():
        if service.get("profiles") not in (None, ["citus"]):
            problems.append(f"{name}: profiles {service['profiles']}")
    default = default_services(spec)
    if set(default) != DEFAULT_SERVICES:
        problems.append(f"default profile: {sorted(default)}")
    for name, service in default.items():
        for dependency in service.get("depends_on", {}):
            if dependency in citus:
                problems.append(f"{name} (default profile) depends on {dependency}")
    nodes = {n: s for n, s in citus.items() if s.get("restart") != "no" and "build" not in s}
    images = {s.get("image") for s in nodes.values()}
    if len(images) != 1 or not all(CITUS_IMAGE.fullmatch(i or "") for i in images):
        problems.append(f"Citus nodes: images {sorted(map(str, images))}")

    registers = [
        (n, s) for n, s in citus.items() if "citus_add_node" in " ".join(as_argv(s["command"]))
    ]
    if len(registers) != 1:
        return [*problems, f"services registering workers: {[n for n, _ in registers]}"]
    register_name, register = registers[0]
    sql = " ".join(as_argv(register["command"]))
    coordinators = re.findall(r"citus_set_coordinator_host\('([\w-]+)', 5432\)", sql)
    workers = set(re.findall(r"citus_add_node\('([\w-]+)', 5432\)", sql))
    if len(coordinators) != 1 or coordinators[0] not in nodes:
        return [*problems, f"{register_name}: coordinator {coordinators}"]
    coordinator = coordinators[0]
    if workers != set(nodes) - {coordinator} or len(workers) < 2:
        problems.append(f"{register_name}: registers {sorted(workers)} of {sorted(nodes)}")
    if "ON_ERROR_STOP=1" not in as_argv(register["command"]):
        problems.append(f"{register_name}: a failed registration does not fail the service")
    environment = register.get("environment", {})
    node_env = nodes[coordinator]["environment"]
    if (environment.get("PGHOST"), environment.get("PGDATABASE")) != (
        coordinator,
        node_env["POSTGRES_DB"],
    ):
        problems.append(f"{register_name}: connects to {environment}")
    for node in nodes:
        condition = register.get("depends_on", {}).get(node, {}).get("condition")
        if condition != "service_healthy":
            problems.append(f"{register_name}: starts before {node} is healthy")

    for name, service in nodes.items():
        env = service["environment"]
        # Nodes connect to each other with the password in PGPASSWORD: one user, one password.
        if (env.get("PGUSER"), env.get("PGPASSWORD")) != (
            node_env["POSTGRES_USER"],
            node_env["POSTGRES_PASSWORD"],
        ) or env["POSTGRES_DB"] != node_env["POSTGRES_DB"]:
            problems.append(f"{name}: not the coordinator's user, password and database")
        if "wal_level=logical" not in as_argv(service.get("command", [])):
            problems.append(f"{name}: no wal_level=logical (online shard moves need it)")
        test = " ".join(service.get("healthcheck", {}).get("test") or [])
        if "pg_extension" not in test or "citus" not in test:
            problems.append(f"{name}: its healthcheck does not wait for the citus extension")

    metering = {
        n: s for n, s in citus.items() if metering_invocations(as_argv(s.get("command", [])))
    }
    migrates = [n for n, s in metering.items() if "migrate" in " ".join(as_argv(s["command"]))]
    if set(metering) != {*migrates, "citus-api", "citus-scheduler"} or len(migrates) != 1:
        return [*problems, f"metering services in the profile: {sorted(metering)}"]
    migrate = migrates[0]
    if services[migrate]["depends_on"].get(register_name, {}).get("condition") != (
        "service_completed_successfully"
    ):
        problems.append(f"{migrate}: may run before the workers are registered")
    for name, service in metering.items():
        # Every node named, the coordinator first (where migrations, sessions and the scheduler
        # go), each worker after it.
        url = service["environment"]["METERING_DATABASE_URL"]
        target = cluster_target(url)
        if target is None or (target[0], target[1][:1], sorted(target[1][1:]), target[2]) != (
            node_env["POSTGRES_USER"],
            [coordinator],
            sorted(workers),
            node_env["POSTGRES_DB"],
        ):
            problems.append(f"{name}: its database is {url}, not every node, the coordinator first")
        if name != migrate:
            if service["depends_on"].get(migrate, {}).get("condition") != (
                "service_completed_successfully"
            ):
                problems.append(f"{name}: may start before {migrate} completed")
            if not service.get("healthcheck", {}).get("test"):
                problems.append(f"{name}: no healthcheck")
            elif service["healthcheck"] != services[name.removeprefix("citus-")]["healthcheck"]:
                problems.append(f"{name}: not the default profile's healthcheck")
    return problems


def test_every_image_is_pinned() -> None:
    assert unpinned_images(compose()) == []


def test_the_citus_profile_is_a_registered_cluster_the_service_uses() -> None:
    spec = compose()
    assert citus_problems(spec) == []
    assert set(citus_services(spec)) == {
        "citus-coordinator",
        "citus-worker-1",
        "citus-worker-2",
        "citus-register",
        "citus-migrate",
        "citus-api",
        "citus-scheduler",
    }
    api = spec["services"]["citus-api"]
    target = cluster_target(api["environment"]["METERING_DATABASE_URL"])
    assert target is not None and target[1][0] == "citus-coordinator"
    # Beside the default stack, not on its port.
    assert api["ports"] == ["8001:8000"] and spec["services"]["api"]["ports"] == ["8000:8000"]
    for name in ("citus-coordinator", "citus-worker-1", "citus-worker-2"):
        (volume,) = spec["services"][name]["volumes"]
        assert volume == f"{name}:/var/lib/postgresql/data"
    exports = spec["services"]["citus-scheduler"]["volumes"]
    assert exports == ["citus-exports:/var/lib/metering/exports"]


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(spec: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node = spec["services"]
        for part in parents:
            node[part] = dict(node[part])  # YAML aliases share dicts: change this one only
            node = node[part]
        if value is None:
            del node[last]
        else:
            node[last] = value

    return change


def _register_sql(sql: list[str]) -> Callable[[dict[str, Any]], None]:
    return _set("citus-register.command", ["psql", "-v", "ON_ERROR_STOP=1", *sql])


ADD_W1 = ["-c", "SELECT citus_add_node('citus-worker-1', 5432)"]
ADD_W2 = ["-c", "SELECT citus_add_node('citus-worker-2', 5432)"]
SET_COORDINATOR = ["-c", "SELECT citus_set_coordinator_host('citus-coordinator', 5432)"]
BROKEN: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "an unpinned Citus image": (_set("citus-worker-1.image", "citusdata/citus:latest"), "images"),
    "a Citus 12 image": (_set("citus-worker-1.image", "citusdata/citus:12.1.6-pg15"), "images"),
    "a build for another PostgreSQL": (
        _set("citus-worker-2.image", "citusdata/citus:13.2.0"),
        "images",
    ),
    "a worker not registered": (_register_sql([*SET_COORDINATOR, *ADD_W1]), "registers"),
    "no coordinator host": (_register_sql([*ADD_W1, *ADD_W2]), "coordinator"),
    "registration not checked": (
        _set("citus-register.command", ["psql", "-c", " ".join(SET_COORDINATOR + ADD_W1 + ADD_W2)]),
        "does not fail",
    ),
    "registered before a worker is up": (
        _set("citus-register.depends_on.citus-worker-2", None),
        "before citus-worker-2 is healthy",
    ),
    "the API on the single server": (
        _set(
            "citus-api.environment.METERING_DATABASE_URL",
            "postgresql+psycopg://metering:x@postgres:5432/metering",
        ),
        "its database is postgresql+psycopg://metering:x@postgres:5432/metering",
    ),
    "the API on the coordinator alone": (
        _set(
            "citus-api.environment.METERING_DATABASE_URL",
            "postgresql+psycopg://metering:x@citus-coordinator:5432/metering",
        ),
        "citus-api: its database is",
    ),
    "a worker left out of the API's nodes": (
        _set(
            "citus-api.environment.METERING_DATABASE_URL",
            "postgresql+psycopg://metering:x@/metering?host=citus-coordinator:5432"
            "&host=citus-worker-1:5432&load_balance_hosts=random",
        ),
        "citus-api: its database is",
    ),
    "a worker first in the API's nodes": (
        _set(
            "citus-api.environment.METERING_DATABASE_URL",
            "postgresql+psycopg://metering:x@/metering?host=citus-worker-1:5432"
            "&host=citus-coordinator:5432&host=citus-worker-2:5432&load_balance_hosts=random",
        ),
        "citus-api: its database is",
    ),
    "migrate before registration": (
        _set("citus-migrate.depends_on", {"citus-coordinator": {"condition": "service_healthy"}}),
        "before the workers are registered",
    ),
    "a worker without a healthcheck": (_set("citus-worker-1.healthcheck", None), "healthcheck"),
    "the API without a healthcheck": (_set("citus-api.healthcheck", None), "no healthcheck"),
    "a worker with another password": (
        _set("citus-worker-2.environment.PGPASSWORD", "other"),
        "user, password and database",
    ),
    "no logical decoding": (_set("citus-worker-1.command", ["postgres"]), "wal_level"),
    "the default profile depending on Citus": (
        _set("api.depends_on.citus-coordinator", {"condition": "service_healthy"}),
        "default profile) depends on citus-coordinator",
    ),
    "a default service moved into the profile": (
        _set("scheduler.profiles", ["citus"]),
        "default profile",
    ),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_the_citus_checks_can_fail(case: str) -> None:
    spec = copy.deepcopy(compose())
    change, expected = BROKEN[case]
    change(spec)
    problems = citus_problems(spec)
    assert any(expected in problem for problem in problems), problems


@pytest.mark.parametrize(
    "image",
    ["citusdata/citus", "citusdata/citus:latest", "postgres:alpine", "grafana/grafana", "pg16"],
)
def test_the_pinning_check_can_fail(image: str) -> None:
    spec = copy.deepcopy(compose())
    spec["services"]["grafana"] = {**spec["services"]["grafana"], "image": image}
    assert unpinned_images(spec) == [f"grafana: {image} is not pinned"]
    spec["services"]["api"] = {k: v for k, v in spec["services"]["api"].items() if k != "build"}
    assert "api: metering:local is not pinned" in unpinned_images(spec)
