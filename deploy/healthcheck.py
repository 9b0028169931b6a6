"""The image's HEALTHCHECK: GET the agent's /healthz; exit 0 when it answers 200.

The agent's serving certificate names the Service, not 127.0.0.1, and liveness is not
a secret: the certificate is not verified. HOTMOUNT_HEALTHCHECK_URL overrides the URL.
"""

import os
import ssl
import sys
import urllib.request

URL = os.environ.get("HOTMOUNT_HEALTHCHECK_URL", "https://127.0.0.1:8443/healthz")


def main() -> int:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(URL, context=context, timeout=4) as response:
            return 0 if response.status == 200 else 1
    except OSError as exc:
        print(f"healthcheck: {URL}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
