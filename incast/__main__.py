import sys

from incast.cli import main

sys.exit(main())
