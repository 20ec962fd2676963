import sys

from trainmath.cli import main

if __name__ == "__main__":  # a spawned child re-imports __main__; only the real entry runs the CLI
    sys.exit(main())
