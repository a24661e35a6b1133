"""``python -m mlcomm.cli``: the same as the ``mlcomm`` command."""

import sys

from . import main

sys.exit(main())
