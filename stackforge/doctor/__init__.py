"""``stackforge doctor``: facts about this host gathered at the edge (:mod:`~stackforge.doctor.facts`),
judged by a pure function (:mod:`~stackforge.doctor.checks`).
"""
