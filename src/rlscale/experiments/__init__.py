"""The field's claims as runnable experiments on the reasoning task (`rlscale experiments`).

Each experiment is one module: the claim in one sentence, the arms it trains (the library's
reasoning configs with dotted overrides, run by the library's own loop), its measurements,
an analysis that turns them into effects with a verdict (verdict.py: supports / contradicts
/ inconclusive, from the mean over seeds and its standard error), and a figure. runner.py
runs one; report.py writes docs/experiments.md from the saved results.
"""
