"""Suite-wide test settings: hypothesis profiles only. Fixtures live in each folder's
conftest.py.

`ci` is deterministic (derandomized, no deadline) and is loaded when the CI environment
variable is set; `dev` draws fresh random examples, fewer of them, for quick local runs.
"""

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, deadline=None, max_examples=50)
settings.register_profile("dev", deadline=None, max_examples=20)
settings.load_profile("ci" if os.environ.get("CI") else "dev")
