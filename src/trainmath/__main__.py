import sys

from trainmath.cli import main

sys.exit(main())
