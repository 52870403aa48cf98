"""The container's health check: exit 0 when ``/healthz`` on this host answers 200 (standard library only,
so the check costs no import of the service). The port is ``AUTOSHARD_PORT`` (default 8000)."""

from __future__ import annotations

import os
import sys
import urllib.request

TIMEOUT_S = 5


def main() -> int:
    port = int(os.environ.get("AUTOSHARD_PORT", "8000"))
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=TIMEOUT_S) as response:
            return 0 if response.status == 200 else 1
    except OSError as error:
        print(f"autoshard health check: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
