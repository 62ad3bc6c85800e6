import sys

from reconcile.cli import main

sys.exit(main())
