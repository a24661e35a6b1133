"""``python -m mlcomm``: the same as the ``mlcomm`` command."""

import sys

from .cli import main

sys.exit(main())
