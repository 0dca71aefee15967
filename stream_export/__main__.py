"""`python -m stream_export`: the same command line as `stream-export`."""

import sys

from stream_export.cli import main

sys.exit(main())
