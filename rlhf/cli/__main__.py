"""`python -m rlhf.cli STAGE ...`: the `rlhf` command (as `python -m rlhf`)."""

import sys

from rlhf.cli import main

sys.exit(main())
