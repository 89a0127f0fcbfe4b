"""Jobs: one script for one (stack, target), run in an image or locally, judged and recorded.

Below the probes and the benchmarks, which only say what differs about their scripts (a
:class:`~stackforge.jobs.job_runner.JobKind`): :mod:`stackforge.jobs.job_runner` runs jobs (one
runner: a job's process ends, one function judges the ending into a record) and
:mod:`stackforge.jobs.campaign` plans a plan's jobs and records them into one run of the results store
(one ``campaign_run`` for the probe, bench and wheel-tier campaigns).
"""
