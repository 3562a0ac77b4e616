import sys

from ringtrain.cli.main import main

sys.exit(main())
