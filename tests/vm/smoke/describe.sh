#!/bin/bash
# In the lab: what cachepilot's read-only inspection says about the cached volume, as JSON on stdout.
set -euo pipefail
root=$(cd "$(dirname "$0")/../../.." && pwd)
exec "$root/.venv/bin/python" - "$LAB_CACHED_DEV" <<'PY'
import dataclasses, json, sys
from cachepilot.backends.inspect import describe_volume, sample_volume
info = describe_volume(sys.argv[1])
print(json.dumps({"info": dataclasses.asdict(info), "sample": dataclasses.asdict(sample_volume(info))}))
PY
