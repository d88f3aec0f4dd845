"""`python -m tokenrelay.cli`: how every tokenrelay child process is started."""

import sys

from tokenrelay.cli.main import main

sys.exit(main())
