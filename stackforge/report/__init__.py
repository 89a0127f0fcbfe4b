"""The outputs read from a plan and a results store: the compatibility matrix (md, html, json, csv),
dead ends, the diff of two runs, the pick of a known-good image, the upgrade report and ``list``.
"""
