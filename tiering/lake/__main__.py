import sys

from fluvial.tiering.lake.cli import main

sys.exit(main())
