"""Figure campaigns: a paper's figure as a file (figure), the runs that make it and the
decisions on more runs (make), the judge that gives its claims their verdicts (judge),
its kept result (kept), checked by what today's code does (check), and ablations of
one setting (ablation)."""
