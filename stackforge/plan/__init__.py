"""Stage 1, plan: a matrix file (:mod:`~stackforge.plan.matrix_file`) judged by the compatibility rules
(:mod:`~stackforge.plan.rules`, tables in :mod:`~stackforge.plan.derive`) for each target, into a
:class:`~stackforge.plan.planner.Plan`; which stacks a command acts on; the index preflight; the plan as text.
"""
