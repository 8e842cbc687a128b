"""Analysis of finished runs: reports and figures from metrics.jsonl, and sweeps over
seeds and settings (launch/report.py, launch/sweep.py, launch/plot.py)."""
