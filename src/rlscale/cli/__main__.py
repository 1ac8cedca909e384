"""`python -m rlscale.cli ...`: the `rlscale` command without its console script."""

from rlscale.cli import main

main()
