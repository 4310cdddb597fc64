"""The image's layers: the dependencies are installed before the code is copied, so a change to
the code (or the README) reuses the dependency layer, as the Dockerfile's comment says."""

from __future__ import annotations

from pathlib import Path

DOCKERFILE = Path(__file__).resolve().parent.parent / "Dockerfile"


def test_dependencies_are_installed_before_the_code_is_copied() -> None:
    steps = [
        line.split(maxsplit=1)
        for line in DOCKERFILE.read_text().splitlines()
        if line and not line.startswith((" ", "#"))
    ]
    copies = [
        (index, arguments.split()[:-1])
        for index, (verb, arguments) in enumerate((s[0], s[1] if len(s) > 1 else "") for s in steps)
        if verb == "COPY"
    ]
    installs = [i for i, step in enumerate(steps) if step[0] == "RUN" and "pip install" in step[1]]
    first_copy, first_sources = copies[0]
    assert set(first_sources) == {"pyproject.toml", "requirements.lock"}
    code = next(i for i, sources in copies if "metering" in sources)
    assert installs and installs[0] < code, "dependencies come before the code"
    assert first_copy < installs[0]
    last = steps[installs[-1]][1]
    assert code < installs[-1] and "--no-deps" in last, "the code's own install adds no packages"
