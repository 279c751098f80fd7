"""`python -m airflow_trainpipe.cli`: the `trainpipe` command without its console script."""

import sys

from airflow_trainpipe.cli import main

sys.exit(main())
