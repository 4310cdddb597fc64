"""A server worker loads only what its routes need: the libraries of the export files (pandas,
pyarrow), of sealing webhook secrets (cryptography) and of sending webhooks (httpx2 and its
transport) are imported where they are used, not by every worker at start (each would carry
tens of MB: the ingest benchmark's peak RSS)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

NOT_AT_START = ("pandas", "pyarrow", "numpy", "cryptography", "httpx2", "httpcore2")

_PROBE = """
import json, sys
import metering.asgi
metering.asgi.create()
print(json.dumps(sorted({name.split(".")[0] for name in sys.modules})))
"""


def test_a_worker_starts_without_the_libraries_of_other_processes(tmp_path: Path) -> None:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("METERING_")},
        "METERING_DATABASE_URL": f"sqlite:///{tmp_path / 'metering.db'}",
        "METERING_DATA_DIR": str(tmp_path),
        "METERING_ADMIN_TOKENS": "admin-token-of-the-import-test",
        "METERING_GATEWAY_TOKENS": "gateway-token-of-the-import-test",
        "METERING_SECRET_KEY": "a-secret-key-of-at-least-32-characters",
        "METERING_PUBLIC_BASE_URL": "http://127.0.0.1:8000",
    }
    done = subprocess.run(
        [sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    loaded = set(json.loads(done.stdout.strip().splitlines()[-1]))
    assert "metering" in loaded and "fastapi" in loaded  # the probe did load the app
    assert loaded.isdisjoint(NOT_AT_START), sorted(loaded & set(NOT_AT_START))
