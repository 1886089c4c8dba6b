"""`python -m disttrain.endpoint`: the progress endpoint's process (endpoint/process.py).

The Kubernetes client libraries are kept out first, before anything here imports kopf (through
apiserver/credentials.py), which would import them (apiserver/client_libraries.py).
"""

import sys

from disttrain.apiserver.client_libraries import keep_out

keep_out()

from disttrain.endpoint.process import main  # noqa: E402  (after keep_out, on purpose)

if __name__ == "__main__":
    sys.exit(main())
