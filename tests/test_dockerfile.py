"""The image's layers: the dependencies are installed before the code is copied, so a change to
the code (or the README) reuses the dependency layer, as the Dockerfile's comment says."""

from __future__ import annotations

from pathlib import Path

DOCKERFILE = Path(__file__).resolve().parent.parent / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """(instruction, arguments) in order, continuation lines joined, comments left out."""
    joined, current = [], ""
    for line in DOCKERFILE.read_text().splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        current += line.rstrip("\\").strip() + " "
        if not line.endswith("\\"):
            joined.append(current.strip())
            current = ""
    return [(text.split(maxsplit=1)[0], text.split(maxsplit=1)[1]) for text in joined]


def test_dependencies_are_installed_before_the_code_is_copied() -> None:
    steps = instructions()
    copies = [(i, args.split()[:-1]) for i, (verb, args) in enumerate(steps) if verb == "COPY"]
    installs = [
        i for i, (verb, args) in enumerate(steps) if verb == "RUN" and "pip install" in args
    ]
    first_copy, first_sources = copies[0]
    assert set(first_sources) == {"pyproject.toml", "requirements.lock"}
    code = next(i for i, sources in copies if "metering" in sources)
    assert installs and first_copy < installs[0] < code, "dependencies come before the code"
    assert code < installs[-1] and "--no-deps" in steps[installs[-1]][1]
