"""``python -m shardviz.cli``."""

import sys

from . import main

sys.exit(main())
