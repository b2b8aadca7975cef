"""``python -m dtlab.cli`` — the same as the ``dtlab`` command."""

import sys

from dtlab.cli import main

sys.exit(main())
