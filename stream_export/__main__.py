import sys

from stream_export.cli import main

sys.exit(main())
